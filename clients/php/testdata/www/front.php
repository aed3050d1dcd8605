<?php
// rld's PHP tests: a front controller (every path of the server comes
// here, as in most PHP frameworks), rate-limited by the attributes of the
// request it serves.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';

$rld = new Rld($_SERVER['RLD_SOCKET'] ?? '/run/rld/rld.sock', timeout: (float) ($_SERVER['RLD_TIMEOUT'] ?? 0.1));
if (!$rld->enforce($rld->attributes())) {
    return; // 429 or 403 sent, with the rate-limit headers
}
echo "served\n";

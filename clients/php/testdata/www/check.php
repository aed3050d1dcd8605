<?php
// The page of rld's PHP tests and docs/clients.md: rate-limited by rld.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';

$rld = new Rld($_SERVER['RLD_SOCKET'] ?? '/run/rld/rld.sock', timeout: (float) ($_SERVER['RLD_TIMEOUT'] ?? 0.1));
if (!$rld->enforce($rld->attributes(), (int) ($_GET['cost'] ?? 1))) {
    return; // 429 or 403 sent, with the rate-limit headers
}
echo "hello from php\n";

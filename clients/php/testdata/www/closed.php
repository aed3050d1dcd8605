<?php
// Like check.php, failing closed: 503 when rld cannot be asked.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';

$rld = new Rld($_SERVER['RLD_SOCKET'] ?? '/run/rld/rld.sock', timeout: (float) ($_SERVER['RLD_TIMEOUT'] ?? 0.1), failOpen: false);
if (!$rld->enforce($rld->attributes())) {
    return;
}
echo "hello from php\n";

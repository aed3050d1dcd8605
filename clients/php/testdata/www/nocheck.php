<?php
// The same page without rld, for the cost figures.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';
echo "hello from php\n";

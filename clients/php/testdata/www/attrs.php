<?php
// rld's PHP tests: prints, in hex, the CHECK frame this request's
// attributes make (what enforce() would send), without sending it.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';

$rld = new Rld($_SERVER['RLD_SOCKET'] ?? '/run/rld/rld.sock');
echo bin2hex(Rld::encode(1, Rld::OP_CHECK, 1, Rld::fitAll($rld->attributes(['tenant' => str_repeat('t', 2000)])))), "\n";

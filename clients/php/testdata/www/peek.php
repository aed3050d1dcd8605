<?php
// rld's PHP tests: renders, with Rld::headers, a PEEK for the rule "page"
// (api_key from the query), to compare with the daemon's HTTP endpoint.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';

$rld = new Rld($_SERVER['RLD_SOCKET'] ?? '/run/rld/rld.sock', timeout: (float) ($_SERVER['RLD_TIMEOUT'] ?? 0.1));
$res = $rld->peek(['api_key' => (string) ($_GET['api_key'] ?? ''), 'endpoint' => '/check.php']);
if ($res === null) {
    http_response_code(500);
    echo "cannot peek\n";
    return;
}
foreach (Rld::headers($res) as $name => $value) {
    header($name . ': ' . $value);
}
echo Rld::STATUS_NAMES[$res['status']], "\n";

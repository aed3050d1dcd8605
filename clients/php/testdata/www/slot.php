<?php
// A page that holds a slot of rld's concurrency limit while it works
// (docs/clients.md): withSlot() releases it in a finally block. With
// ?est=N it also counts N units of the "units" rule, and with ?actual=M
// it settles them at M when it ends instead.
require $_SERVER['RLD_CLIENT'] ?? '/usr/share/rld/Rld.php';

$rld = new Rld($_SERVER['RLD_SOCKET'] ?? '/run/rld/rld.sock', timeout: (float) ($_SERVER['RLD_TIMEOUT'] ?? 0.1));
$est = (int) ($_GET['est'] ?? 0);
echo $rld->withSlot(
    $rld->attributes($est > 0 ? [['units', '1']] : []),
    function (?array $res) use ($rld): string {
        usleep((int) ($_GET['ms'] ?? 0) * 1000); // the page's work
        if (isset($_GET['actual'])) {
            $rld->setActualCost($res, (int) $_GET['actual']);
        }
        if (isset($_GET['fail'])) {
            throw new RuntimeException('the work failed');
        }
        return "done\n";
    },
    function (?array $res): string {
        http_response_code($res === null ? 503 : 429);
        foreach ($res === null ? [] : Rld::headers($res) as $name => $value) {
            header($name . ': ' . $value);
        }
        return "busy\n";
    },
    max($est, 1),
);

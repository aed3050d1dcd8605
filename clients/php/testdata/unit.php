<?php
// unit.php: runs Rld.php's request helpers outside a server, for
// php_test.go's TestPHPUnit. Reads a JSON object from stdin:
// {"server": {...$_SERVER...}, "headers": [...] or null, "fit": [[name, value], ...]}
// and prints {"attributes": [...], "fit": [...], "error": "..."}.
declare(strict_types=1);
require __DIR__ . '/../Rld.php';

$in = json_decode((string) file_get_contents('php://stdin'), true, 512, JSON_THROW_ON_ERROR);
$out = ['attributes' => null, 'fit' => [], 'error' => null];
$_SERVER = $in['server'] + ['argv' => []];
try {
    $rld = $in['headers'] === null ? new Rld() : new Rld(headers: $in['headers']);
    $out['attributes'] = $rld->attributes($in['extra'] ?? []);
    if (isset($in['apiKeyHeader'])) {
        $out['attributes'] = Rld::requestDescriptors($in['apiKeyHeader']);
    }
} catch (InvalidArgumentException $e) {
    $out['error'] = $e->getMessage();
}
foreach ($in['fit'] as [$name, $value]) {
    $out['fit'][] = Rld::fit($name, $value);
}
echo json_encode($out, JSON_THROW_ON_ERROR | JSON_UNESCAPED_SLASHES), "\n";

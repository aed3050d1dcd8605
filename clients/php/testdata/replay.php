<?php
// replay.php CORPUS replays clients/testdata/golden.tsv against Rld.php.
// It prints "ok ..." and exits 0 when every line matches, else prints one
// "FAIL ..." line per mismatch and exits 1. For every decode line it also
// flips each byte of the frame and requires the decoder to reject it or
// decode another answer.
declare(strict_types=1);
require __DIR__ . '/../Rld.php';

function unhex(string $h): string
{
    return $h === '-' ? '' : (string) hex2bin($h);
}

function descs(string $field): array
{
    if ($field === '-') {
        return [];
    }
    $list = [];
    foreach (explode(',', $field) as $item) {
        [$n, $v] = explode(':', $item, 2);
        $list[] = [unhex($n), unhex($v)];
    }
    return $list;
}

const FIELDS = ['id', 'op', 'flags', 'status', 'limit', 'remaining', 'reset', 'retry', 'window', 'quota', 'quota_window', 'next', 'rule', 'code', 'message', 'lease'];

function differs(array $a, array $b): ?string
{
    foreach (FIELDS as $k) {
        if ($a[$k] !== $b[$k]) {
            return $k;
        }
    }
    return null;
}

$fails = [];
$kinds = [];
$cases = 0;
$flips = 0;
foreach (file($argv[1], FILE_IGNORE_NEW_LINES) as $line) {
    if ($line === '' || $line[0] === '#') {
        continue;
    }
    $t = explode("\t", $line);
    [$kind, $name] = [$t[0], $t[1] ?? '?'];
    $cases++;
    $kinds[$kind] = true;
    switch ($kind) {
        case 'encode':
            try {
                $hex = bin2hex(Rld::encode((int) $t[2], (int) $t[3], (int) $t[4], descs($t[5])));
                if ($hex !== $t[6]) {
                    $fails[] = "FAIL $name encoded " . substr($hex, 0, 120) . ' want ' . substr($t[6], 0, 120);
                }
            } catch (InvalidArgumentException $e) {
                $fails[] = "FAIL $name encode error: " . $e->getMessage();
            }
            break;
        case 'encode_error':
            try {
                Rld::encode((int) $t[2], (int) $t[3], (int) $t[4], descs($t[5]));
                $fails[] = "FAIL $name encoded a frame; want an error: {$t[6]}";
            } catch (InvalidArgumentException $e) {
            }
            break;
        case 'encode_lease':
            try {
                $hex = bin2hex(Rld::encode((int) $t[2], (int) $t[3], (int) $t[4], [], unhex($t[5])));
                if ($hex !== $t[6]) {
                    $fails[] = "FAIL $name encoded " . substr($hex, 0, 120) . ' want ' . substr($t[6], 0, 120);
                }
            } catch (InvalidArgumentException $e) {
                $fails[] = "FAIL $name encode error: " . $e->getMessage();
            }
            break;
        case 'encode_lease_error':
            try {
                Rld::encode((int) $t[2], (int) $t[3], (int) $t[4], [], unhex($t[5]));
                $fails[] = "FAIL $name encoded a frame; want an error: {$t[6]}";
            } catch (InvalidArgumentException $e) {
            }
            break;
        case 'decode':
        case 'decode_acquire':
            $frame = unhex($t[2]);
            $want = [
                'id' => (int) $t[3], 'op' => (int) $t[4], 'flags' => (int) $t[5], 'status' => (int) $t[6],
                'limit' => (int) $t[7], 'remaining' => (int) $t[8], 'reset' => (int) $t[9], 'retry' => (int) $t[10],
                'window' => (int) $t[11], 'quota' => (int) $t[12], 'quota_window' => (int) $t[13], 'next' => (int) $t[14],
                'rule' => unhex($t[15]), 'code' => (int) $t[16], 'message' => unhex($t[17]),
                'lease' => $kind === 'decode_acquire' ? unhex($t[18]) : '',
            ];
            try {
                $got = Rld::decode($frame);
            } catch (UnexpectedValueException $e) {
                $fails[] = "FAIL $name decode error: " . $e->getMessage();
                break;
            }
            if (($k = differs($got, $want)) !== null) {
                $fails[] = "FAIL $name $k " . var_export($got[$k], true) . ' want ' . var_export($want[$k], true);
            }
            for ($i = 0, $n = strlen($frame); $i < $n; $i++) {
                foreach ([0x01, 0xff] as $x) {
                    $flipped = $frame;
                    $flipped[$i] = chr(ord($frame[$i]) ^ $x);
                    $flips++;
                    try {
                        if (differs(Rld::decode($flipped), $want) === null) {
                            $fails[] = "FAIL $name byte $i xor $x decodes to the same answer";
                        }
                    } catch (UnexpectedValueException $e) {
                    }
                }
            }
            break;
        case 'decode_error':
            try {
                Rld::decode(unhex($t[2]));
                $fails[] = "FAIL $name decoded; want an error: {$t[3]}";
            } catch (UnexpectedValueException $e) {
            }
            break;
        default:
            $fails[] = "FAIL $name unknown kind $kind";
    }
}
foreach (['encode', 'encode_error', 'encode_lease', 'encode_lease_error', 'decode', 'decode_acquire', 'decode_error'] as $k) {
    if (!isset($kinds[$k])) {
        $fails[] = "FAIL the corpus has no $k line";
    }
}
if ($fails) {
    echo implode("\n", $fails), "\n";
    exit(1);
}
echo "ok $cases cases, $flips flipped frames\n";

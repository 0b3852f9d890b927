#!/usr/bin/env python3
"""The layering DESIGN.md's Layout table promises, checked on every source
file: a folder includes only its own headers and those of the folders it may
depend on. Prints each forbidden include (file:line) and exits 1 if any."""
import os
import re
import sys
import tempfile

# folder -> folders it may include from (besides itself). Keep in step with
# the "may depend on" column of DESIGN.md's Layout table.
ALLOWED = {
    'common': set(),
    'conf': {'common'},
    'kernels': {'common'},
    'model': {'common', 'kernels'},
    'kvcache': {'common', 'kernels'},
    # the grammar walks the tokenizer's bytes; the sampler shares the
    # backend's top-k code so that host and device pick the same tokens
    'sched': {'common', 'kvcache', 'kernels', 'model'},
    'engine': {'common', 'sched', 'kvcache', 'model', 'kernels'},
    # request types from sched, scorer and KV type names from kvcache
    'api': {'common', 'engine', 'sched', 'kvcache', 'model', 'kernels'},
    'daemon': {'common', 'conf', 'api', 'engine', 'sched', 'kvcache', 'model', 'kernels'},
    # tools: everything below the daemon (dp-template renders templates
    # through api/'s JSON bridge, as the daemon does)
    'tools': {'common', 'conf', 'api', 'engine', 'sched', 'kvcache', 'model', 'kernels'},
    'loadtest': {'common'},
}
EXTS = ('.c', '.h', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def check(root):
    bad = 0
    files = 0
    for folder, allowed in sorted(ALLOWED.items()):
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith(EXTS):
                    continue
                path = os.path.join(dirpath, name)
                files += 1
                with open(path, encoding='utf-8', errors='replace') as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        to = m.group(1)
                        if to != folder and to in ALLOWED and to not in allowed:
                            print('%s:%d: %s/ may not include %s/ (%s)' % (
                                os.path.relpath(path, root), lineno, folder, to, line.strip()))
                            bad += 1
    print('layers: %d files, %d forbidden includes' % (files, bad))
    return bad


def self_test():
    """A tree with one forbidden include (kvcache/ -> engine/) and one
    allowed one must give exactly one report."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, 'kvcache'))
        with open(os.path.join(d, 'kvcache', 'x.c'), 'w') as f:
            f.write('#include "common/dp.h"\n#include "engine/engine.h"\n')
        return check(d) == 1


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    if not self_test():
        print('layers: FAIL: the self-test\'s forbidden include was not reported')
        return 1
    return 1 if check(root) else 0


if __name__ == '__main__':
    sys.exit(main())

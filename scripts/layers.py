#!/usr/bin/env python3
"""DESIGN.md's layering, in one table, enforced by the build.

Each folder is a library that may include the headers of its own folder and
of the folders ALLOWED names (its direct arrows). Two things use the table:

  layers.py --views BUILDDIR
      at configure time, makes BUILDDIR/views/FOLDER/: links to the folder
      itself and to every folder it may reach through its arrows (their
      closure, since an allowed header includes its own folder's
      dependencies). A folder is compiled with its view as its only include
      path, so including anything outside the closure fails to compile.

  layers.py --check SRCROOT [--stamp FILE --depfile FILE]
      at build time (and as the `layers` unit test), reads every source file
      and reports each include of a folder that is not a direct arrow
      (file:line), exiting 1 so the build fails. The depfile lists the files
      read, so the check runs again when one changes.

With no arguments it runs a self-test on a made-up tree and then --check on
the source root."""
import os
import re
import sys
import tempfile

# folder -> the folders it may include from directly (besides itself). Keep
# in step with the "may depend on" column of DESIGN.md's Layout table.
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
    # request types from sched; the names of the scorers and KV types a
    # request may choose from kvcache
    'api': {'common', 'engine', 'sched', 'kvcache', 'model'},
    'daemon': {'common', 'conf', 'api', 'engine', 'kernels', 'model'},
    # tools: everything below the daemon (dp-template renders templates
    # through api/'s JSON bridge, as the daemon does)
    'tools': {'common', 'conf', 'api', 'engine', 'sched', 'kvcache', 'model', 'kernels'},
    'loadtest': {'common'},
}
EXTS = ('.c', '.h', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def closure(folder):
    """The folders a folder's view holds: itself and all it reaches."""
    seen, todo = {folder}, [folder]
    while todo:
        for to in ALLOWED[todo.pop()]:
            if to not in seen:
                seen.add(to)
                todo.append(to)
    return seen


def make_views(builddir, srcroot):
    """BUILDDIR/views/FOLDER/DEP -> SRCROOT/DEP, as relative links (a build
    directory moved with its source tree keeps working)."""
    for folder in ALLOWED:
        view = os.path.join(builddir, 'views', folder)
        os.makedirs(view, exist_ok=True)
        want = closure(folder)
        for name in os.listdir(view):
            if name not in want:
                os.unlink(os.path.join(view, name))
        for dep in sorted(want):
            link = os.path.join(view, dep)
            target = os.path.relpath(os.path.join(srcroot, dep), view)
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(target, link)


def check(root, read=None):
    bad = 0
    files = 0
    for folder, allowed in sorted(ALLOWED.items()):
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith(EXTS):
                    continue
                path = os.path.join(dirpath, name)
                files += 1
                if read is not None:
                    read.append(path)
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
    allowed one must give exactly one report; views must hold exactly the
    closure (api/ reaches kernels/ through engine/, model/ never sees
    kvcache/)."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, 'kvcache'))
        with open(os.path.join(d, 'kvcache', 'x.c'), 'w') as f:
            f.write('#include "common/dp.h"\n#include "engine/engine.h"\n')
        if check(d) != 1:
            return False
        make_views(os.path.join(d, 'b'), d)
        api = set(os.listdir(os.path.join(d, 'b', 'views', 'api')))
        model = set(os.listdir(os.path.join(d, 'b', 'views', 'model')))
        return 'kernels' in api and 'daemon' not in api and model == {'model', 'common', 'kernels'}


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    if len(argv) >= 3 and argv[1] == '--views':
        make_views(argv[2], os.path.dirname(here))
        return 0
    if len(argv) >= 3 and argv[1] == '--check':
        root = argv[2]
        opts = dict(zip(argv[3::2], argv[4::2]))
        read = []
        bad = check(root, read)
        if '--depfile' in opts:
            with open(opts['--depfile'], 'w') as f:
                f.write('%s: %s\n' % (opts.get('--stamp', 'layers.stamp'),
                                      ' '.join(p.replace(' ', '\\ ') for p in read)))
        if bad:
            return 1
        if '--stamp' in opts:
            with open(opts['--stamp'], 'w') as f:
                f.write('ok\n')
        return 0
    if not self_test():
        print('layers: FAIL: the self-test did not give the expected reports and views')
        return 1
    return 1 if check(argv[1] if len(argv) > 1 else os.path.dirname(here)) else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))

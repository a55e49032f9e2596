"""The documentation against the repository: every relative link in README.md and docs/*.md
leads to a file (and heading) that exists, docs/ holds only what they link to, every command the
README and the pages it moved its detail to show names scripts, configs and folders that exist, and
the README stays a guide of at most 250 lines with no figure that changes with the machine or
the commit. Text only, no runs: quick and deterministic."""

import importlib.util
import os
import re
import shlex
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, 'docs')
PAGES = ['README.md'] + sorted(os.path.join('docs', f) for f in os.listdir(DOCS) if f.endswith('.md'))
LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)')  # [text](target), ![alt](target)
FENCE = re.compile(r'^[ \t]*```([\w-]*)[ \t]*\n(.*?)^[ \t]*```', re.M | re.S)
SHELL = ('sh', 'bash', 'shell', 'console')
RUNNERS = ('python', 'python3', 'torchrun', 'bash', 'lm_eval')  # the words a README command starts with
# Paths a command names that the repository holds (rather than a run's output or a prepared dataset).
SOURCE_DIRS = ('config/', 'configure/', 'docs/', 'orthogpt/', 'tests/', 'tools/')
SOURCE_EXT = ('.py', '.sh', '.yaml', '.yml')


def read(page):
    with open(os.path.join(ROOT, page), encoding='utf-8') as f:
        return f.read()


def prose(text):
    """The text outside fenced code blocks, each block blanked (its line count kept)."""
    return FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), text)


def links(page):
    """(line, target) of every relative link of a page, outside its code blocks."""
    text = prose(read(page))
    for m in LINK.finditer(text):
        target = m.group(1)
        if not re.match(r'[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto:
            yield text.count('\n', 0, m.start()) + 1, target


def slug(heading):
    """GitHub's anchor of a heading: its text as rendered, lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link: its text
    text = ''.join(c for c in text.strip().lower()
                   if c in ' -_' or unicodedata.category(c)[0] in 'LN')
    return text.replace(' ', '-')


def anchors(page):
    """The anchors of a page's headings, as GitHub numbers repeated ones (x, x-1, x-2, ...)."""
    seen, out = {}, set()
    for line in prose(read(page)).splitlines():
        m = re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f'{base}-{n}')
    return out


def resolve(page, target):
    """(the file a link leads to, relative to the repository, its anchor or '')."""
    path, _, anchor = target.partition('#')
    path = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    return path, anchor


@pytest.mark.parametrize('page', PAGES)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for line, target in links(page):
        path, anchor = resolve(page, target)
        if not os.path.exists(os.path.join(ROOT, path)):
            broken.append(f"{page}:{line}: {target} (no {path})")
        elif anchor and path.endswith('.md') and anchor not in anchors(path):
            broken.append(f"{page}:{line}: {target} (no heading #{anchor} in {path})")
    assert not broken, 'broken links:\n' + '\n'.join(broken)


def test_docs_holds_only_what_the_pages_link_to():
    """Every file under docs/ is linked from README.md or a page in docs/, or lies in a linked folder."""
    linked = {os.path.normpath(resolve(page, target)[0]) for page in PAGES for _, target in links(page)}
    stray = []
    for folder, dirs, files in os.walk(DOCS):
        dirs[:] = sorted(d for d in dirs if not d.startswith(('.', '__')))
        for name in sorted(files):
            path = os.path.relpath(os.path.join(folder, name), ROOT)
            in_linked_folder = any(path.startswith(p + os.sep) for p in linked)
            if not name.startswith('.') and path not in linked and not in_linked_folder:
                stray.append(path)
    assert not stray, ("files in docs/ that nothing links to (link them from a page, or move or delete "
                       "them):\n" + '\n'.join(stray))


def commands(text):
    """(line, argv) of every command of a page: each line of its sh code blocks (with its
    continuation lines) and each inline code span, that runs one of RUNNERS."""
    found = []
    for m in FENCE.finditer(text):
        if m.group(1) in SHELL:
            first = text.count('\n', 0, m.start(2)) + 1
            found += [(first + offset, argv) for argv, offset in split_commands(m.group(2))]
    outside = prose(text)
    for m in re.finditer(r'(?<!`)`([^`\n]+)`(?!`)', outside):
        line = outside.count('\n', 0, m.start()) + 1
        found += [(line, argv) for argv, _ in split_commands(m.group(1))]
    return sorted(found, key=lambda f: f[0])


def split_commands(block):
    """(argv, line offset) of each command of a shell snippet that runs one of RUNNERS: a line,
    with its continuation lines (a trailing backslash, or a quote open over the line's end, as in
    a multi-line `python -c "..."`), split at ;, &&, || and |; comments and leading VAR=value
    assignments dropped."""
    out, pending, start = [], '', 0
    for n, line in enumerate(block.split('\n')):
        if not pending:
            start = n
        if line.rstrip().endswith('\\'):
            pending += line.rstrip()[:-1] + ' '
            continue
        pending += line + '\n'
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        pending, argv = '', []
        for word in words + [';']:
            if word in (';', '&&', '||', '|', '&'):
                if argv and argv[0] in RUNNERS:
                    out.append((argv, start))
                argv = []
            elif argv or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*=\S*', word):  # HF_HUB_OFFLINE=1 lm_eval
                argv.append(word)
    return out


def named_paths(argv):
    """The repository paths a command names: the script it runs, and every argument (or an
    option's value) that is a source file or lies in a source folder."""
    runner, args = argv[0], argv[1:]
    paths = []
    if runner in ('python', 'python3'):
        if args and args[0] == '-c':
            return []  # code, not a file
        if args and args[0] == '-m':
            args = args[2:]  # a module (venv, pytest): its arguments may name folders (tests/unit)
        else:
            script = next((a for a in args if not a.startswith('-')), None)
            paths += [script] if script else []
    elif runner == 'torchrun':
        paths += [a for a in args if a.endswith('.py')][:1]
    elif runner == 'bash':
        paths += args[:1]
    for arg in args:
        value = arg.split('=', 1)[1] if arg.startswith('--') and '=' in arg else arg
        if any(c in value for c in '*?<>{}') or value.upper() == value:  # a glob or a placeholder (CONFIG)
            continue
        if value.endswith(SOURCE_EXT) or value.startswith(SOURCE_DIRS) or value + '/' in SOURCE_DIRS:
            paths.append(value)
    return list(dict.fromkeys(paths))


GUIDES = ['README.md', 'docs/usage.md', 'docs/export.md', 'docs/reliability.md']  # the user's guide and its detail


@pytest.mark.parametrize('page', GUIDES)
def test_every_command_of_the_guide_names_files_that_exist(page):
    text = read(page)
    found = commands(text)
    if page == 'README.md':
        assert len(found) >= 15, f"the command parser found only {len(found)} commands in README.md"
    missing = [f"{page}:{line}: {' '.join(argv)}\n    names {path}, which does not exist"
               for line, argv in found for path in named_paths(argv)
               if not os.path.exists(os.path.join(ROOT, path))]
    assert not missing, '\n'.join(missing)


def test_the_readme_is_a_guide_of_at_most_250_lines():
    assert read('README.md').count('\n') <= 250, "move detail to docs/ (usage.md, export.md, reliability.md)"


def test_the_readme_holds_no_figure_that_changes_with_the_machine_or_the_commit():
    """Test counts, timings and speeds go to docs/performance.md, which keeps them current; the README links there."""
    found = re.findall(r'\d+ (?:passed|skipped)|\b\d+(?:\.\d+)? ?(?:ms|s|min)(?=[\s,.;)]|$)|\d[\d,.]*k? tok(?:ens)?/s|\d+% MFU',
                       prose(read('README.md')))
    assert not found, f"machine- or commit-dependent figures in README.md: {found}"


def test_the_command_parser_reads_what_the_readme_writes():
    """The parser on the README's forms: continuation lines, a multi-line `python -c`, comments,
    an environment prefix, && chains, inline spans."""
    text = '\n'.join([
        '```sh',
        'python3 -m venv .venv && . .venv/bin/activate   # a comment naming nothing.py',
        'bash install.sh',
        'torchrun --standalone --nproc_per_node=2 train.py config/a.py \\',
        '    --stack=config/cpu.py',
        'python -c "',
        'import x',
        'print(1)"',
        'HF_HUB_OFFLINE=1 lm_eval --include_path tools/lm_eval_tasks --tasks t',
        'python tools/compare.py CONFIG --out=out-x/y.py',
        'python -m pytest -q tests/unit   # 320 passed',
        '```',
        'Run `python sample.py --out_dir=OUT` or `torchrun --nproc_per_node=N train.py CONFIG`.',
    ])
    assert [named_paths(argv) for _, argv in commands(text)] == [
        [], ['install.sh'], ['train.py', 'config/a.py', 'config/cpu.py'], [], ['tools/lm_eval_tasks'],
        ['tools/compare.py', 'out-x/y.py'], ['tests/unit'], ['sample.py'], ['train.py']]
    assert [line for line, _ in commands(text)] == [2, 3, 4, 6, 9, 10, 11, 13, 13]


def test_the_requirements_name_files_that_exist():
    text = read('requirements.txt')
    named = re.findall(r'\b((?:tests|tools|config|data|orthogpt)/[\w./-]+\.\w+)', text)
    missing = [p for p in named if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"requirements.txt names files that do not exist: {missing}"


def test_prepare_with_input_leaves_the_text_where_the_readme_reads_it(tmp_path):
    """`data/shakespeare_char/prepare.py --input PATH` copies the text to <out_dir>/input.txt, which
    the README's `data/prepare_text.py --files data/shakespeare_char/input.txt` reads next."""
    spec = importlib.util.spec_from_file_location('prepare', os.path.join(ROOT, 'data', 'shakespeare_char',
                                                                          'prepare.py'))
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    text = 'First Citizen:\nBefore we proceed any further, hear me speak.\n' * 20
    (tmp_path / 'elsewhere.txt').write_text(text, encoding='utf-8')
    out = tmp_path / 'shakespeare_char'
    prepare.main(['--input', str(tmp_path / 'elsewhere.txt'), '--out_dir', str(out)])
    assert (out / 'input.txt').read_text(encoding='utf-8') == text
    assert {'train.bin', 'val.bin', 'meta.json'} <= {p.name for p in out.iterdir()}
    prepare.main(['--input', str(out / 'input.txt'), '--out_dir', str(out)])  # its own input.txt: kept
    assert (out / 'input.txt').read_text(encoding='utf-8') == text

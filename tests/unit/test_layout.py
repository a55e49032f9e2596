"""The shape of the repository: scripts at the root, one library package, imports that flow one way
(model.py <- configure/ <- orthogpt/ <- scripts and tools), no cycle, and light scripts."""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def modules():
    """{module name: path} of every project module: not the tests, nor the config files."""
    found = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith('.') and d not in ('tests', '__pycache__', 'docs', 'config')
                   and not d.startswith('out')]
        for f in files:
            if f.endswith('.py'):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, '.')
                found[rel.removesuffix('.__init__')] = os.path.join(folder, f)
    return found


def imports():
    """{module: the project modules it imports}, a package's import counting as one of its __init__."""
    known, graph = modules(), {}
    for name, path in known.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found |= {n for n in names if n in known and n != name}
        graph[name] = found
    return graph


def layer(name):
    if name == 'model':
        return 'model'
    if name.split('.')[0] in ('configure', 'orthogpt'):
        return 'library'
    return 'script'


def test_the_root_holds_few_scripts_and_the_rest_sits_in_folders():
    root_py = sorted(f for f in os.listdir(ROOT) if f.endswith('.py'))
    assert root_py == ['model.py', 'sample.py', 'train.py'] and len(root_py) <= 5
    assert {m for m in modules() if m.startswith('tools.')} >= {
        'tools.bench', 'tools.suite', 'tools.compare', 'tools.export', 'tools.eval_hellaswag', 'tools.plot_grad_norms',
        'tools.plot_dynamics', 'tools.plot_curves'}


def test_the_package_docstring_names_every_module():  # the README points readers to it for the package's map
    import orthogpt
    listed = {line.split()[0] for line in orthogpt.__doc__.splitlines() if line.startswith('    ') and line.split()}
    assert {m.split('.')[1] for m in modules() if m.startswith('orthogpt.') and m.count('.') == 1} <= listed


def test_imports_flow_one_way_without_a_cycle():
    graph = imports()
    assert graph['model'] == set(), "model.py imports no project module"
    for name, deps in graph.items():
        if layer(name) == 'library':
            assert all(layer(d) != 'script' for d in deps), f"{name} imports a script: {deps}"
        if name.startswith('configure'):
            assert not {d for d in deps if d.startswith('orthogpt')}, f"{name} imports the package: {deps}"
        if layer(name) == 'script':
            assert not {d for d in deps if layer(d) == 'script' and not d == 'tools'}, f"{name} imports a script: {deps}"
    done, path = set(), []

    def visit(node):  # depth first; a node met again on the current path closes a cycle
        assert node not in path, f"import cycle: {' -> '.join(path[path.index(node):] + [node])}"
        if node in done:
            return
        path.append(node)
        for dep in sorted(graph[node]):
            visit(dep)
        path.pop()
        done.add(node)
    for node in sorted(graph):
        visit(node)


def loaded(code, wanted):
    """The modules whose names `wanted` accepts among those a fresh interpreter has loaded after running code."""
    probe = (f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in sys.modules if ({wanted})(m)))")
    done = subprocess.run([sys.executable, '-c', probe], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize('code', ['import model', 'import sys; sys.argv = ["sample.py", "--help"]; import runpy; '
                                                  'runpy.run_path("sample.py", run_name="__main__")'])
def test_the_model_and_sample_py_load_neither_fsdp_nor_the_data_pipeline(code):
    assert loaded(code, "lambda m: 'fsdp' in m or m in ('orthogpt.tasks', 'orthogpt.windows', 'orthogpt.images', "
                        "'orthogpt.parallel', 'datasets')") == '[]'


def test_train_py_loads_fsdp_and_distributed_checkpoints_only_for_a_sharded_run():
    """Their imports (DTensor's with them) add about a second to the start of each process: of every run, and
    of every rank of a torchrun."""
    assert loaded('import train', "lambda m: m.startswith(('torch.distributed.fsdp', 'torch.distributed.tensor', "
                                  "'torch.distributed.checkpoint', 'orthogpt.sharded'))") == '[]'


def test_train_py_is_a_script_of_short_functions():
    with open(os.path.join(ROOT, 'train.py')) as f:
        tree = ast.parse(f.read())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    lengths = {n.name: n.end_lineno - n.lineno + 1 for n in functions}
    assert max(lengths.values()) <= 100, lengths
    arguments = {n.name: len(n.args.args) + len(n.args.kwonlyargs) for n in functions}
    assert max(arguments.values()) <= 5, arguments


def test_the_tools_are_functions_of_at_most_60_lines():
    long = {}
    for name in sorted(os.listdir(os.path.join(ROOT, 'tools'))):
        if name.endswith('.py'):
            with open(os.path.join(ROOT, 'tools', name)) as f:
                tree = ast.parse(f.read())
            long.update({f"{name}:{n.name}": n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno >= 60})
    assert not long, f"split these into functions of at most 60 lines: {long}"


def test_model_py_stays_short():
    """The model file holds the model alone (GPT-2 checkpoints are read in orthogpt/hf.py, the batched Q/K/V maps
    held in orthogpt/maps.py, each rule's departures from its paper told in docs/rules.md, fused kernels in
    orthogpt/hc_kernels.py), and stays short: about 60 lines a rule for its eleven rules, and the two trunks, with
    Depth's lists of one length for per-block compile and the DecodeState's buffers a layer at a time."""
    with open(os.path.join(ROOT, 'model.py')) as f:
        assert len(f.read().splitlines()) <= 1141

"""The compile-depth table (docs/performance.md, "Compiling deep models") from the bench outputs beside this file
(run.sh): per rule and depth, eager's step, and per-block and whole-model compile's time to compile and step.

    python docs/logs/compile_depth/table.py
"""
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = ('additive', 'orthogonal', 'rotation', 'ngpt', 'hc', 'mhc', 'ddl', 'attnres', 'denseformer')
# cells timed on a later VM (†), faster at least for HC (its eager step at 32 layers: 791 ms then, 449-582 ms there
# with either commit's code, hc32_ab.txt): compare them with the others through ratios inside a cell alone
LATER = {(rule, 16) for rule in RULES} | {('hc', 4), ('hc', 32)}


def rows(text):
    """{'eager' | 'blocks' | 'model': (ms/iter, paired change against eager, compile s)} of one bench output."""
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip('|').split('|')]
        if not line.startswith('| ') or len(cells) < 10 or not re.match(r'[\d.]+$', cells[2]):
            continue
        how = 'eager' if cells[0].endswith('compile=False') else 'model' if 'compile_scope=model' in cells[0] else 'blocks'
        found[how] = float(cells[2]), float(cells[8].rstrip('%')) / 100, float(cells[9])
    return found


def main():
    print("| rule | layers | eager, ms/iter | per block: compile, s | per block: ms/iter (vs eager) | whole: compile, s | "
          "whole: ms/iter (vs eager) | per block / whole, step |")
    print("|---|---|---|---|---|---|---|---|")
    compile_s = {}
    for rule in RULES:
        for layers in (4, 16, 32):
            path = os.path.join(HERE, f'{rule}-{layers}.txt')
            if not os.path.exists(path):
                print(f"| {rule} | {layers} | not yet measured | | | | | |")
                continue
            text = open(path).read()
            r = rows(text)
            eager, blocks, model = r['eager'], r['blocks'], r.get('model')
            compile_s[rule, layers] = blocks[2]
            timeout = re.search(r'not finished in (\d+) s', text)
            whole = (f"{model[2]:.1f} | {model[0]:.1f} ({model[1]:+.1%})" if model else
                     f"not finished in {timeout.group(1)} s | -" if timeout else "- | -")
            ratio = f"{(1 + blocks[1]) / (1 + model[1]):.3f}" if model else '-'
            print(f"| {rule} | {layers}{' †' if (rule, layers) in LATER else ''} | {eager[0]:.1f} | {blocks[2]:.1f} | {blocks[0]:.1f} ({blocks[1]:+.1%}) | "
                  f"{whole} | {ratio} |")
    print("\n| rule | per-block compile at 32 layers / at 4 |\n|---|---|")
    for rule in RULES:
        if (rule, 4) in compile_s and (rule, 32) in compile_s:
            print(f"| {rule} | {compile_s[rule, 32] / compile_s[rule, 4]:.2f} |")


if __name__ == '__main__':
    main()

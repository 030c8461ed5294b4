#!/usr/bin/env python3
"""cuobjdump -sass listings of two objects: split per kernel ("Function : <mangled>"), normalise the
name (anonymous-namespace hash; old template arguments <D, BM, bf16, 12293> -> new <D, bf16>; the
convert kernel's old name), drop the /*addr*/ columns' addresses are kept (relative to the function,
so they must match too) and compare each kernel's instruction text."""
import re, sys
def norm(n):
    n = re.sub(r'\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}', 'ANON', n)
    n = re.sub(r'22fast_bwd_atomic_kernelILi(\d+)ELi\d+ELb(\d)ELi12293EE', r'22fast_bwd_atomic_kernelILi\1ELb\2EE', n)
    n = re.sub(r'32fast_bwd_dq_convert_tiled_kernelILi(\d+)ELi\d+ELb(\d)EE', r'26fast_bwd_dq_convert_kernelILi\1ELb\2EE', n)
    return n
def kernels(path):
    out, cur = {}, None
    for line in open(path):
        m = re.search(r'Function : (\S+)', line)
        if m:
            cur = norm(m.group(1)); out[cur] = []; continue
        if cur and re.search(r'/\*[0-9a-f]{4}\*/', line):
            out[cur].append(re.sub(r'\s+', ' ', line.strip()))
    return out
a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
ok = set(a) == set(b)
if not ok: print('kernel sets differ:', sorted(set(a) ^ set(b)))
for k in sorted(set(a) & set(b)):
    same = a[k] == b[k]; ok &= same
    print('SAME' if same else 'DIFF', k, len(a[k]), 'instructions,', sum('HMMA' in l for l in b[k]), 'HMMA')
print('ALL IDENTICAL' if ok else 'DIFFERENCES FOUND')

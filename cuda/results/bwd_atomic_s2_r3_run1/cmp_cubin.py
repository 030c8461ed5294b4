#!/usr/bin/env python3
"""Compare the machine code of every kernel in two sm_90 cubins (ELF).
For each section .text.<mangled kernel>, .nv.info.<k>, .nv.shared.<k>, .nv.constant0.<k>, the
kernel's name is normalised (anonymous-namespace hash, file name and template arguments that only
existed in the old file are mapped to the new naming), and the section BYTES are compared.
.text.<k> bytes ARE the SASS (128-bit instructions); equal bytes = identical SASS.
Relocations against .text sections are compared too (symbol names normalised)."""
import re, struct, sys, hashlib

def sections(path):
    b = open(path, 'rb').read()
    assert b[:4] == b'\x7fELF' and b[4] == 2, path
    shoff, = struct.unpack_from('<Q', b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', b, 0x3A)
    hdrs = []
    for i in range(shnum):
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from('<IIQQQQIIQQ', b, shoff + i * shentsize)
        hdrs.append((name, typ, off, size, link, info, entsize))
    strtab = hdrs[shstrndx]
    def s(o, tab):
        base = tab[2] + o
        return b[base:b.index(b'\0', base)].decode()
    out = {}
    for (name, typ, off, size, link, info, entsize) in hdrs:
        out[s(name, strtab)] = (typ, b[off:off + size] if typ != 8 else b'', link, info, entsize)
    # symbol table, for relocations
    names = [s(h[0], strtab) for h in hdrs]
    symtab = [h for h in hdrs if h[1] == 2]
    syms = []
    if symtab:
        st = symtab[0]
        strt = hdrs[st[4]]
        for k in range(st[3] // 24):
            nm, info_, other, shndx, val, sz = struct.unpack_from('<IBBHQQ', b, st[2] + 24 * k)
            syms.append(s(nm, strt))
    return out, names, syms

def norm(name):
    name = re.sub(r'\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}', 'ANON', name)
    # old kernel names: fast_bwd_atomic_kernelILi128ELi64ELb0ELi12293EE -> new ILi128ELb0EE
    name = re.sub(r'22fast_bwd_atomic_kernelILi(\d+)ELi\d+ELb(\d)ELi12293EE', r'22fast_bwd_atomic_kernelILi\1ELb\2EE', name)
    name = re.sub(r'32fast_bwd_dq_convert_tiled_kernelILi(\d+)ELi\d+ELb(\d)EE', r'26fast_bwd_dq_convert_kernelILi\1ELb\2EE', name)
    return name

def table(path):
    secs, names, syms = sections(path)
    t = {}
    for n, (typ, data, link, info, entsize) in secs.items():
        if typ == 9 or typ == 4:  # REL / RELA
            target = names[info] if info < len(names) else '?'
            ent = 24 if typ == 4 else 16
            rel = []
            for k in range(len(data) // ent):
                off, inf = struct.unpack_from('<QQ', data, ent * k)
                add = struct.unpack_from('<q', data, ent * k + 16)[0] if typ == 4 else 0
                rel.append((off, inf & 0xffffffff, norm(syms[inf >> 32]) if (inf >> 32) < len(syms) else '?', add))
            t['REL ' + norm(target)] = repr(rel).encode()
        else:
            t[norm(n)] = data
    return t

a, b = table(sys.argv[1]), table(sys.argv[2])
ok = True
keys = sorted(set(a) | set(b))
for k in keys:
    if not (k.startswith('.text') or k.startswith('.nv.info.') or k.startswith('.nv.shared') or k.startswith('.nv.constant0') or k.startswith('REL')):
        continue
    if k not in a or k not in b:
        print(('ONLY IN OLD ' if k in a else 'ONLY IN NEW ') + k)
        ok = False
        continue
    same = a[k] == b[k]
    ok &= same
    extra = '  (%d instructions)' % (len(a[k]) // 16) if k.startswith('.text') else ''
    print('%s %s %dB%s' % ('SAME' if same else 'DIFF', k, len(a[k]), extra) + ('' if same else ' vs %dB' % len(b[k])))
print('ALL IDENTICAL' if ok else 'DIFFERENCES FOUND')
sys.exit(0 if ok else 1)

#!/usr/bin/env python3
"""Compare the device code of every kernel between two builds of the CUDA objects.

Usage: cubin_diff.py OLD_BUILD_DIR NEW_BUILD_DIR [--sass]

Each build directory is a CMake build tree (e.g. build/cuda); every `*.cu.o` below it is read, and
every `*.cubin` (the ELF image `nvcc -cubin` writes with an object's flags, for the objects whose
fatbinary is compressed).
A restructuring that moves host code (launchers, front doors, configuration types) must leave
the kernels' machine code alone; this script says whether it did.

Default mode (no tool needed): the sm_90/sm_90a cubin ELF images embedded in each object's
fatbinary are parsed, and per kernel the `.text.<kernel>` bytes (the SASS itself), the relocation
records of that text (offset and type) and the kernel's `.nv.info.<kernel>` attributes (registers,
parameter layout, barriers; the constant bank's symbol-table index, which only says where the
symbol table lists it, left out) are compared. Line information lives in separate debug sections, so
builds that differ only in line numbers compare equal. `--sass` instead runs `cuobjdump -sass` on
each object and compares each function's instructions with the line-information comments
removed (where the CUDA toolkit's cuobjdump is installed).

Kernels are matched by mangled name; a kernel whose name changed (a template argument renamed or
retyped, the code the same) is matched to an unmatched kernel of the other build with identical
code and reported as renamed. Exit status 0 when every kernel of both builds has an identical
partner, 1 otherwise.
"""
import glob
import os
import re
import struct
import subprocess
import sys


def elf_images(blob):
    """The CUDA ELF images (cubins) inside a host object's bytes."""
    out, pos = [], -1  # an image may start the file (a cubin written by nvcc -cubin)
    while True:
        pos = blob.find(b"\x7fELF\x02\x01\x01", pos + 1)
        if pos < 0:
            return out
        if blob[pos + 18:pos + 20] != struct.pack("<H", 190):  # e_machine EM_CUDA
            continue
        shoff, = struct.unpack_from("<Q", blob, pos + 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, pos + 0x3A)
        out.append(blob[pos:pos + shoff + shentsize * shnum])
        pos += shoff + shentsize * shnum - 1


def sections(elf):
    """{name: (type, bytes, link, info)} of one ELF image."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, link, info = struct.unpack_from("<IIQQQQII", elf, shoff + i * shentsize)
        heads.append((name, typ, off, size, link, info))
    strtab_off, strtab_size = heads[shstrndx][2], heads[shstrndx][3]
    strtab = elf[strtab_off:strtab_off + strtab_size]
    out = {}
    for i, (name, typ, off, size, link, info) in enumerate(heads):
        label = strtab[name:strtab.index(b"\0", name)].decode()
        data = b"" if typ == 8 else elf[off:off + size]  # SHT_NOBITS holds no bytes
        out[label] = (typ, data, link, info, i)
    return out


EIATTR_PARAM_CBANK = 0x0A  # payload: the symbol index of the kernel's constant bank, then offset, size


def nv_info_attributes(data):
    """The kernel's .nv.info attributes as (attribute, payload) pairs, with the one field that is
    ELF bookkeeping rather than code cleared: EIATTR_PARAM_CBANK's symbol-table index (it moves
    when kernels are renamed and the symbol table is sorted differently)."""
    out, i = [], 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 0x04:  # EIFMT_SVAL: 16-bit size, then the payload
            size, = struct.unpack_from("<H", data, i + 2)
            payload = data[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt in (0x02, 0x03):  # EIFMT_BVAL, EIFMT_HVAL: a 16-bit value
            payload = data[i + 2:i + 4]
            i += 4
        else:  # EIFMT_NVAL: no value
            payload = b""
            i += 2
        if attr == EIATTR_PARAM_CBANK and len(payload) >= 4:
            payload = b"\0\0\0\0" + payload[4:]
        out.append((attr, payload))
    return tuple(out)


def kernels_of_cubin(elf):
    """{kernel: signature} where signature holds everything that makes up its device code."""
    secs = sections(elf)
    by_index = {v[4]: k for k, v in secs.items()}
    out = {}
    for label, (typ, data, link, info, _i) in secs.items():
        if not label.startswith(".text."):
            continue
        name = label[len(".text."):]
        relocs = []
        for rl, (rtyp, rdata, rlink, rinfo, _j) in secs.items():
            if rtyp in (4, 9) and by_index.get(rinfo) == label:  # SHT_RELA, SHT_REL of this text
                step = 24 if rtyp == 4 else 16
                for k in range(0, len(rdata), step):
                    r_off, r_info = struct.unpack_from("<QQ", rdata, k)
                    relocs.append((r_off, r_info & 0xFFFFFFFF))
        nv_info = nv_info_attributes(secs.get(".nv.info." + name, (0, b""))[1])
        shared = len(secs.get(".nv.shared." + name, (0, b""))[1])
        const0 = len(secs.get(".nv.constant0." + name, (0, b""))[1])
        out[name] = (data, tuple(sorted(relocs)), nv_info, shared, const0)
    return out


def kernels_from_cubins(build):
    kernels = {}
    objects = glob.glob(os.path.join(build, "**", "*.cu.o"), recursive=True)
    cubins = glob.glob(os.path.join(build, "**", "*.cubin"), recursive=True)  # `nvcc -cubin` outputs
    for obj in sorted(objects + cubins):
        with open(obj, "rb") as f:
            blob = f.read()
        images = elf_images(blob)
        if not images:  # nvcc compresses a large fatbinary: its cubins are not visible as ELF images
            print(f"note: no cubin visible in {obj} (a compressed fatbinary?): compare cubins written by "
                  "`nvcc -cubin` with the object's flags instead", file=sys.stderr)
        for elf in images:
            for name, sig in kernels_of_cubin(elf).items():
                kernels[(os.path.basename(obj), name)] = sig
    return kernels


def kernels_from_sass(build):
    kernels = {}
    for obj in sorted(glob.glob(os.path.join(build, "**", "*.cu.o"), recursive=True)):
        text = subprocess.run(["cuobjdump", "-sass", obj], check=True, capture_output=True, text=True).stdout
        name, lines = None, []
        for line in text.splitlines() + ["Function : <end>"]:
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                if name:
                    kernels[(os.path.basename(obj), name)] = ("\n".join(lines),)
                name, lines = m.group(1), []
            elif name and not line.lstrip().startswith("//##") and line.strip():
                lines.append(re.sub(r"\s+", " ", line.strip()))
    return kernels


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    read = kernels_from_sass if "--sass" in argv else kernels_from_cubins
    old, new = read(argv[1]), read(argv[2])
    same = [k for k in old if k in new and old[k] == new[k]]
    differ = [k for k in old if k in new and old[k] != new[k]]
    only_old = [k for k in old if k not in new]
    only_new = [k for k in new if k not in old]
    renamed = []
    free_new = {k: new[k] for k in only_new}
    for k in list(only_old):
        match = next((n for n, sig in free_new.items() if n[0] == k[0] and sig == old[k]), None)
        if match:
            renamed.append((k, match))
            del free_new[match]
            only_old.remove(k)
            only_new.remove(match)
    print(f"kernels: {len(old)} old, {len(new)} new; identical by name: {len(same)}; "
          f"identical under a new name: {len(renamed)}; different: {len(differ)}; "
          f"only old: {len(only_old)}; only new: {len(only_new)}")
    for k, n in renamed:
        print(f"  renamed, same code: {k[0]}: {k[1]}\n                   -> {n[1]}")
    for k in differ:
        print(f"  DIFFERENT: {k[0]}: {k[1]}")
    for k in only_old:
        print(f"  only in the old build: {k[0]}: {k[1]}")
    for k in only_new:
        print(f"  only in the new build: {k[0]}: {k[1]}")
    return 0 if not (differ or only_old or only_new) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

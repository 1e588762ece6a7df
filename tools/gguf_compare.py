#!/usr/bin/env python3
"""Compare the tensors of two GGUF files by name: type, shape and data bytes.

Used to check `step35 quantize` against llama-quantize (docs/quantize.md): the two files
must hold the same tensors with the same types and bytes; tensor order, metadata and
padding may differ. Standard library only.

usage: gguf_compare.py A.gguf B.gguf [--metadata] [--quiet]
       gguf_compare.py --digest A.gguf
exit status: 0 when every tensor matches, 1 when something differs, 2 on bad input.

--digest prints one order-independent fingerprint of a file's tensors, the one
tests/test_quantize.cpp checks llama-quantize's outputs against: sha256 over the tensors
sorted by name, each contributing its name, a zero byte, its ggml type id (u32 little-endian)
and its data bytes; then the tensor count per type.
"""
import argparse
import hashlib
import mmap
import struct
import sys

# ggml type id -> (name, block elements, block bytes), the types step35 reads.
TYPES = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 10: ("q2_K", 256, 84),
    11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176),
    14: ("q6_K", 256, 210), 16: ("iq2_xxs", 256, 66), 17: ("iq2_xs", 256, 74),
    18: ("iq3_xxs", 256, 98), 19: ("iq1_s", 256, 50), 20: ("iq4_nl", 32, 18), 21: ("iq3_s", 256, 110),
    22: ("iq2_s", 256, 82), 23: ("iq4_xs", 256, 136), 29: ("iq1_m", 256, 56), 30: ("bf16", 1, 2),
    34: ("tq1_0", 256, 54), 35: ("tq2_0", 256, 66), 39: ("mxfp4", 32, 17),
}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, buf, name):
        self.buf, self.pos, self.name = buf, 0, name

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.name}: truncated at offset {self.pos}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self):
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.name}: truncated string at offset {self.pos}")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("<I"), self.take("<Q")
            return [self.value(etype) for _ in range(n)]
        if vtype not in SCALAR:
            raise ValueError(f"{self.name}: unknown value type {vtype} at offset {self.pos}")
        return self.take(SCALAR[vtype])


def load(path):
    f = open(path, "rb")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    r = Reader(buf, path)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version} (expected 3)")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    align = meta.get("general.alignment", 32)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        ne = [r.take("<q") for _ in range(n_dims)]
        ttype, offset = r.take("<I"), r.take("<Q")
        infos.append((name, ne, ttype, offset))
    data_start = (r.pos + align - 1) // align * align
    tensors = {}
    for order, (name, ne, ttype, offset) in enumerate(infos):
        if ttype not in TYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported type {ttype}")
        tname, blk, bbytes = TYPES[ttype]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // blk * bbytes
        start = data_start + offset
        if start + nbytes > len(buf):
            raise ValueError(f"{path}: tensor {name} data runs past the end of the file")
        tensors[name] = {"type": tname, "type_id": ttype, "ne": ne, "nbytes": nbytes, "order": order,
                         "sha256": hashlib.sha256(buf[start:start + nbytes]).hexdigest(),
                         "data": buf[start:start + nbytes]}
    return meta, tensors


def digest(tensors):
    h = hashlib.sha256()
    counts = {}
    for name in sorted(tensors, key=lambda n: n.encode()):
        t = tensors[name]
        h.update(name.encode() + b"\0" + struct.pack("<I", t["type_id"]))
        h.update(t["data"])
        counts[t["type"]] = counts.get(t["type"], 0) + 1
    return h.hexdigest(), " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--digest", action="store_true", help="print the tensor fingerprint of A")
    ap.add_argument("--metadata", action="store_true", help="also list metadata keys that differ")
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    args = ap.parse_args()
    if args.digest != (args.b is None):
        ap.error("give two files to compare, or --digest and one file")
    try:
        meta_a, ta = load(args.a)
        if args.digest:
            print(*digest(ta))
            return 0
        meta_b, tb = load(args.b)
    except (OSError, ValueError) as e:
        print(f"gguf_compare: {e}", file=sys.stderr)
        return 2

    problems = 0
    by_type = {}
    for name in sorted(set(ta) | set(tb), key=lambda n: (ta.get(n) or tb[n])["order"]):
        a, b = ta.get(name), tb.get(name)
        if a is None or b is None:
            problems += 1
            print(f"{name}: only in {args.a if a else args.b}")
            continue
        what = []
        if a["type"] != b["type"]:
            what.append(f"type {a['type']} vs {b['type']}")
        if a["ne"] != b["ne"]:
            what.append(f"shape {a['ne']} vs {b['ne']}")
        if not what and a["sha256"] != b["sha256"]:
            what.append("data differs")
        if what:
            problems += 1
            print(f"{name}: " + ", ".join(what))
        else:
            t = by_type.setdefault(a["type"], [0, 0])
            t[0] += 1
            t[1] += a["nbytes"]
            if not args.quiet:
                print(f"{name}: same ({a['type']}, {a['nbytes']} bytes)")
    if args.metadata:
        for key in sorted(set(meta_a) | set(meta_b)):
            va, vb = meta_a.get(key, "<absent>"), meta_b.get(key, "<absent>")
            if va != vb:
                short = lambda v: (repr(v)[:60] + "...") if len(repr(v)) > 60 else repr(v)
                print(f"metadata {key}: {short(va)} vs {short(vb)}")
    same = sum(v[0] for v in by_type.values())
    types = ", ".join(f"{k} x{v[0]}" for k, v in sorted(by_type.items()))
    print(f"{same} of {len(set(ta) | set(tb))} tensors identical in type and bytes ({types}); {problems} differ")
    return 0 if problems == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

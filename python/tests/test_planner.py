"""What the package does without torch or a GPU: import, the planner, its argument errors.
CI runs these (scripts/test-python.sh); they compare against values derived here from
docs/contract.md §1-§2, not against the library's own answers."""

import subprocess
import sys

import pytest

import dcp_mla
from dcp_mla import DcpMlaError, DcpMlaValueError


def owner(t, d, i):
    return (t // i) % d


# Runs in a fresh interpreter where `import torch` fails, whether or not torch is installed.
_WITHOUT_TORCH = "import sys; sys.modules['torch'] = None\n"


def test_import_needs_no_torch():
    code = _WITHOUT_TORCH + "import dcp_mla; print(dcp_mla.plan(context=4096, dcp_size=2).local_lens)"
    got = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert got.strip() == "[2048, 2048]"


def test_ops_without_torch_say_what_is_missing():
    code = _WITHOUT_TORCH + (
        "import dcp_mla\n"
        "try:\n    dcp_mla.decode_dense\nexcept ImportError as e:\n    print(e)\n"
        "else:\n    raise SystemExit('decode_dense resolved without torch')\n")
    got = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "needs torch" in got
    with pytest.raises(AttributeError):
        dcp_mla.no_such_function


def test_version_and_variants():
    assert dcp_mla.__version__ == dcp_mla.version()
    names = dcp_mla.variants()
    assert any(n.startswith("dcp_mla_decode_sm90_trio") for n in names), names
    assert any(n.endswith("schedule_lead") for n in names), names
    assert any(n.startswith("dcp_topk_merge") for n in names), names
    assert dcp_mla.compute_capability_supported(9, 0)
    assert not dcp_mla.compute_capability_supported(7, 0)
    assert dcp_mla.default_scale() == pytest.approx(576 ** -0.5, rel=1e-7)


@pytest.mark.parametrize("d,i", [(1, 1), (2, 1), (4, 1), (4, 4), (8, 2), (8, 16)])
def test_local_len_counts_owned_tokens(d, i):
    for length in [0, 1, i, d * i - 1, d * i, d * i + 1, 1000, 4097]:
        for r in range(d):
            want = sum(1 for t in range(length) if owner(t, d, i) == r)
            assert dcp_mla.local_len(length, d, i, r) == want, (length, d, i, r)


def test_token_address():
    d, i, b = 4, 2, 16
    for t in [0, 1, 2, 7, 8, 100, 12345]:
        rank, col, slot = dcp_mla.token_address(t, d, i, b)
        assert rank == owner(t, d, i)
        local = (t // (d * i)) * i + t % i  # position among the rank's own tokens
        assert (col, slot) == (local // b, local % b), t


def test_causal_local_lens():
    lens, qs, d, i = [10, 7, 1], [2, 3, 1], 4, 1
    for r in range(d):
        want = []
        for length, q in zip(lens, qs):
            for j in range(q):
                seen = length - q + 1 + j
                want.append(sum(1 for t in range(seen) if owner(t, d, i) == r))
        assert dcp_mla.causal_local_lens(lens, qs, d, i, r) == want
    with pytest.raises(ValueError, match="qs"):
        dcp_mla.causal_local_lens([1, 2], [1], d, i, 0)


def test_pages_and_capacity():
    assert dcp_mla.pages_for(0, 4, 64) == 0
    assert dcp_mla.pages_for(1, 4, 64) == 1
    assert dcp_mla.pages_for(256, 4, 64) == 1
    assert dcp_mla.pages_for(257, 4, 64) == 2
    tokens1, pages1 = dcp_mla.capacity(656 * 64 * 1000, "fp8_656", 64, 1)
    tokens4, pages4 = dcp_mla.capacity(656 * 64 * 1000, "fp8_656", 64, 4)
    assert (tokens1, pages1) == (64_000, 1000)
    assert (tokens4, pages4) == (256_000, 1000)
    assert dcp_mla.capacity(1152 * 64 * 10, "bf16", 64, 2) == (1280, 10)


def test_plan():
    p = dcp_mla.plan(context=131072, dcp_size=4, batch=64, local_heads=16)
    assert p.heads == 64
    assert p.local_lens == [32768] * 4
    assert p.pages_per_request == 131072 // (64 * 4)
    assert p.cache_bytes_per_rank == 64 * p.pages_per_request * 64 * 656
    for kind in ("dense", "sparse"):
        s = p.decode_splits[kind]
        assert s >= 1
        assert (p.decode_workspace_bytes[kind] == 0) == (s == 1)
    assert p.a2a_slot_bytes % 16 == 0
    assert p.a2a_slot_bytes >= 64 * 16 * (512 * 2 + 4)
    assert p.topk_workspace_bytes > 0
    odd = dcp_mla.plan(context=1001, dcp_size=4, interleave=8, batch=1, topk=None, kv_format="bf16")
    assert sum(odd.local_lens) == 1001 and odd.topk_workspace_bytes is None


def test_planner_errors_name_the_argument():
    with pytest.raises(DcpMlaError) as e:
        dcp_mla.check_topk(3, 256)  # D·K = 768
    assert e.value.status == "INVALID_CONFIG"
    with pytest.raises(DcpMlaError) as e:
        dcp_mla.check_topk(1, 300)
    assert e.value.status == "INVALID_CONFIG"
    with pytest.raises(DcpMlaError) as e:
        dcp_mla.plan(context=4096, dcp_size=3, tp=8)
    assert e.value.status == "INVALID_CONFIG" and "3" in e.value.message
    with pytest.raises(DcpMlaError):
        dcp_mla.check_config(8, 4, 3, 64)  # I does not divide B
    with pytest.raises(DcpMlaError):
        dcp_mla.local_len(10, 4, 1, 4)  # rank out of range
    with pytest.raises(ValueError, match="kv_format"):
        dcp_mla.plan(context=4096, dcp_size=2, kv_format="fp4")


def test_prefill_plan_covers_every_prefix_token():
    prefix, d, i, b = [300, 0, 1000], 2, 1, 16
    pp = dcp_mla.prefill_plan(prefix, d, i, b, 1 << 20)
    assert pp.chunk_tokens % (b * d) == 0 and pp.num_chunks >= 1
    covered = 0
    for c in range(pp.num_chunks):
        table = dcp_mla.prefill_piece_table(prefix, d, i, b, 1 << 20, c)
        assert len(table) == pp.max_pieces and all(len(row) == 8 for row in table)
        covered += sum(1 for row in table if any(row))
    assert covered >= 2  # the two non-empty prefixes have at least one piece each


def _header_text():
    import pathlib
    return (pathlib.Path(__file__).resolve().parents[2] / "ffi" / "include" / "dcp_mla.h").read_text()


def _ctype_of(c_type):
    """The ctypes type a C parameter type of the header takes (None: one the package never uses)."""
    from ctypes import POINTER, c_float, c_int32, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

    from dcp_mla import _lib

    t = " ".join(c_type.replace("const ", " ").replace("struct ", " ").split())
    scalars = {"size_t": c_size_t, "int32_t": c_int32, "uint32_t": c_uint32, "uint64_t": c_uint64,
               "uint8_t": c_uint8, "float": c_float, "DcpMlaTensor": _lib.Tensor,
               **{cls.__name__: cls for cls in _lib.ARGS.values()}}
    if t in scalars:
        return scalars[t]
    if t in ("void *", "DcpMlaDevice *"):
        return c_void_p  # a device handle, a stream, a host or device address
    if t in ("void **", "DcpMlaDevice **"):
        return POINTER(c_void_p)
    if t.endswith(" *") and t[:-2] in scalars:
        return POINTER(scalars[t[:-2]])
    return None


def test_ctypes_signatures_match_the_header():
    # Every function the package declares takes the header's parameters, type by type: ctypes
    # cannot check a call against the library, so a stale declaration (a parameter added, moved
    # or retyped by an ABI revision) would pass the wrong values silently.
    import re

    from dcp_mla import _lib

    text = _header_text()
    for name, args in _lib.SIGNATURES.items():
        m = re.search(r"\b" + name + r"\(([^)]*)\);", text)
        assert m, f"{name} is not in the header"
        params = [" ".join(p.split()) for p in m.group(1).split(",") if p.strip() not in ("", "void")]
        assert len(params) == len(args), f"{name}: the header takes {len(params)} arguments, _lib declares {len(args)}"
        for i, (param, got) in enumerate(zip(params, args)):
            stars = param.count("*")
            base = re.sub(r"\w+$", "", param.replace("*", " ")).strip()  # the type, its name dropped
            want = _ctype_of(base + (" " + "*" * stars if stars else ""))
            assert want is not None, f"{name} argument {i} ({param}): a C type the test does not map"
            assert got == want, f"{name} argument {i} ({param}): _lib declares {got.__name__}, the header says {want.__name__}"
    # every status-returning function of the header is declared (or deliberately left to C)
    declared = set(_lib.SIGNATURES)
    for name in re.findall(r"enum DcpMlaStatus (dcp_mla_\w+)\(", text):
        assert name in declared, f"{name} is in the header but not in _lib.SIGNATURES"


def test_the_codes_match_the_header():
    # the #define codes and the status enum, by name and value, against the package's constants
    import re

    from dcp_mla import _lib

    text = _header_text()
    defines = dict((k, int(v)) for k, v in re.findall(r"#define DCP_MLA_(\w+) (\d+)", text))
    for name in ["DTYPE_U8", "DTYPE_BF16", "DTYPE_F32", "DTYPE_I32", "KV_BF16", "KV_FP8_656", "LSE_BASE_E",
                 "LSE_BASE_2", "SCHEDULE_COMPUTE", "SCHEDULE_REUSE", "LENS_LOCAL", "LENS_GLOBAL", "LENS_GLOBAL_CAUSAL"]:
        assert getattr(_lib, name) == defines[name], name
    assert _lib.ABI_VERSION == defines["ABI_VERSION"]
    enum = re.search(r"enum DcpMlaStatus \{([^}]*)\}", text).group(1)
    statuses = re.findall(r"DCP_MLA_STATUS_(\w+) = (\d+)", enum)
    assert statuses, "the header's DcpMlaStatus enum was not found"
    assert [n for n, _ in sorted(statuses, key=lambda x: int(x[1]))] == _lib.STATUS
    assert [int(v) for _, v in sorted(statuses, key=lambda x: int(x[1]))] == list(range(len(_lib.STATUS)))


def _header_structs(text):
    """Every `typedef struct Name { ... } Name;` of the header: {name: [(field, C type)]}."""
    import re

    out = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\n\} \1;", text, re.S):
        fields = []
        for line in body.splitlines():
            decl = line.split("//")[0].strip().rstrip(";")
            if not decl:
                continue
            m = re.match(r"(.*?)(\w+)(\[(\d+)\])?$", decl)
            ctype = " ".join(m.group(1).replace("const ", "").replace("struct ", "").split())
            fields.append((m.group(2), ctype + (f"[{m.group(4)}]" if m.group(3) else "")))
        out[name] = fields
    return out


def test_argument_structs_match_the_header_field_by_field():
    # Python's ctypes structures against the header's: the same structs, fields, order and C
    # types (ffi/tests/layout.rs also compares their offsets and sizes with the Rust structs').
    import ctypes

    from dcp_mla import _lib

    header = _header_structs(_header_text())
    ours = {"DcpMlaTensor": _lib.Tensor, **{cls.__name__: cls for cls in _lib.ARGS.values()}}
    assert sorted(header) == sorted(ours)
    for name, cls in ours.items():
        assert [f for f, _ in cls._fields_] == [f for f, _ in header[name]], name
        for (field, t), (_, ctype) in zip(cls._fields_, header[name]):
            if ctype.endswith("]"):
                base, n = ctype[:-1].split("[")
                assert issubclass(t, ctypes.Array) and t._length_ == int(n), (name, field)
                t, ctype = t._type_, base
            want = _ctype_of(ctype)
            want = ctypes.c_void_p if ctype.endswith("*") else want
            assert t == want, f"{name}.{field}: _lib has {t.__name__}, the header says {ctype}"
    # every operation takes its struct: dcp_mla_launch_<op>(const DcpMla<Op>Args *)
    for fn, cls in _lib.ARGS.items():
        assert "dcp_mla_launch_" in fn and f"{fn}(const struct {cls.__name__} *args);" in _header_text(), fn


def test_one_pack_fills_a_struct_as_its_fields_say():
    # the fast fill (one struct.pack_into) writes what ctypes reads back field by field
    from dcp_mla import _lib

    cls = _lib.ARGS["dcp_mla_launch_decode_dense"]
    leaves = _lib.leaves(cls)
    values = [1.5 if t.__name__ == "c_float" else i + 1 for i, (_, _, t) in enumerate(leaves)]
    buf = cls()
    _lib.packer(cls).pack_into(buf, 0, *values)
    assert buf.struct_size == 1 and buf.device == 2 and buf.q.data == 4 and buf.q.strides[3] == 11
    assert buf.scale == 1.5 and buf.empty_lse_inf == values[-1]
    assert [p for p, _, _ in leaves[:5]] == ["struct_size", "device", "stream", "q.data", "q.numel"]
    # a later fill rewrites every byte, padding included: nothing of an earlier call survives
    _lib.packer(cls).pack_into(buf, 0, *[0] * len(leaves))
    assert bytes(buf) == bytes(len(bytes(buf)))


def test_a_value_the_struct_cannot_hold_is_refused_by_field():
    from dcp_mla import _lib

    cls = _lib.ARGS["dcp_mla_launch_decode_dense"]
    n = len(_lib.leaves(cls))
    batch = [p for p, _, _ in _lib.leaves(cls)].index("batch")
    for bad, error in [(-1, ValueError), (1 << 64, ValueError), (2.5, TypeError)]:
        values = [0] * n
        values[batch] = bad
        with pytest.raises(error, match=r"DcpMlaDecodeDenseArgs\.batch"):
            _lib.fill_checked(cls, cls(), values)


def test_launches_without_a_device_are_refused_by_name():
    # the compatibility rule and the device check through ctypes, on a machine without a GPU
    import ctypes

    from dcp_mla import _lib

    cls = _lib.ARGS["dcp_mla_launch_merge_two"]
    a = cls(struct_size=ctypes.sizeof(cls))
    a.out_a.data = a.out_b.data = a.out.data = 0x10000
    a.lse_a.data = a.lse_b.data = a.lse.data = 0x20000
    for t in (a.out_a, a.out_b, a.out):
        t.numel, t.dtype = 512, _lib.DTYPE_F32
    for t in (a.lse_a, a.lse_b, a.lse):
        t.numel, t.dtype = 1, _lib.DTYPE_F32
    a.rows, a.lse_a_base, a.lse_b_base = 1, _lib.LSE_BASE_E, _lib.LSE_BASE_E
    with pytest.raises(DcpMlaError) as e:
        _lib.call("dcp_mla_launch_merge_two", a)
    assert e.value.status == "NULL_POINTER" and "`device`" in e.value.message
    a.struct_size = 8
    with pytest.raises(DcpMlaValueError) as e:
        _lib.call("dcp_mla_launch_merge_two", a)
    assert "`DcpMlaMergeTwoArgs.struct_size`" in e.value.message
    # a revision-4 caller's positional entry point answers by name
    old = _lib.lib().dcp_mla_merge_two
    old.restype = ctypes.c_int32
    assert _lib.STATUS[old()] == "UNSUPPORTED"
    assert "dcp_mla_launch_merge_two" in _lib.lib().dcp_mla_last_error().decode()


@pytest.mark.parametrize("kwargs,needle", [
    (dict(dcp_size=3, tp=6), "D = 3"),
    (dict(local_heads=256 // 4), "heads"),
    (dict(num_q=9), "q = 9"),
    (dict(batch=0), "batch = 0"),
    (dict(context=1 << 40), "context"),
])
def test_plan_refuses_what_the_cli_refuses(kwargs, needle):
    args = {"context": 4096, "dcp_size": 4, **kwargs}
    with pytest.raises(DcpMlaError) as e:
        dcp_mla.plan(**args)
    assert e.value.status == "INVALID_CONFIG" and needle in e.value.message, e.value.message


@pytest.mark.parametrize("kwargs", [dict(dcp_size=3), dict(dcp_size=3, tp=6), dict(batch=0), dict(num_q=9)])
def test_a_refused_configuration_is_a_value_error(kwargs):
    # catchable as ValueError (as a bad Python value is) and still as DcpMlaError / RuntimeError
    args = {"context": 4096, "dcp_size": 4, **kwargs}
    with pytest.raises(ValueError) as e:
        dcp_mla.plan(**args)
    assert type(e.value) is DcpMlaValueError, type(e.value)
    assert isinstance(e.value, DcpMlaError) and isinstance(e.value, RuntimeError)
    assert e.value.status == "INVALID_CONFIG" and e.value.message in str(e.value)


def test_error_kinds_follow_the_status():
    from dcp_mla import _lib
    # the library's INVALID_ARGUMENT (a rank outside the group, a zero block size) is a ValueError too
    for call in (lambda: dcp_mla.local_len(10, 4, 1, 4), lambda: dcp_mla.pages_for(100, 4, 0)):
        with pytest.raises(DcpMlaValueError) as e:
            call()
        assert e.value.status == "INVALID_ARGUMENT" and isinstance(e.value, ValueError)
    # every other status stays a DcpMlaError that is no ValueError: a null out-pointer here
    with pytest.raises(DcpMlaError) as e:
        _lib.call("dcp_mla_pages_for", 4, 64, 100, None)
    assert e.value.status == "NULL_POINTER" and not isinstance(e.value, ValueError)
    for code, name in enumerate(_lib.STATUS):
        if name == "SUCCESS":
            continue
        err = DcpMlaError.of("f", code, "m")
        assert err.status == name and isinstance(err, DcpMlaError)
        assert isinstance(err, ValueError) == (name in ("INVALID_ARGUMENT", "INVALID_CONFIG")), name


@pytest.mark.parametrize("d", [0, 3, 5, 6, 7, 9, 16])
def test_only_the_built_dcp_sizes(d):
    with pytest.raises(DcpMlaError):
        dcp_mla.local_len(100, d, 1, 0)
    with pytest.raises(DcpMlaError):
        dcp_mla.check_config(16 * max(d, 1), d, 1, 64)


@pytest.mark.parametrize("value,error", [
    (-1, ValueError), (1 << 64, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError), (None, TypeError),
])
def test_integer_arguments_are_checked_by_name(value, error):
    for call, name in [
        (lambda: dcp_mla.plan(context=value, dcp_size=4), "context"),
        (lambda: dcp_mla.plan(context=4096, dcp_size=value), "dcp_size"),
        (lambda: dcp_mla.plan(context=4096, dcp_size=4, batch=value), "batch"),
        (lambda: dcp_mla.local_len(value, 4, 1, 0), "length"),
        (lambda: dcp_mla.pages_for(100, 4, value), "block_size"),
        (lambda: dcp_mla.decode_num_splits(value, 1, 64, False), "batch"),
        (lambda: dcp_mla.causal_local_lens([value], [1], 4, 1, 0), "lens[0]"),
        (lambda: dcp_mla.capacity(value, "bf16", 64, 4), "bytes_per_rank"),
    ]:
        with pytest.raises(error) as e:
            call()
        assert str(e.value).startswith(name), (name, str(e.value))


def test_call_checks_integers_even_without_a_name():
    from dcp_mla import _lib
    with pytest.raises(ValueError, match="dcp_mla_check_topk argument 1"):
        _lib.call("dcp_mla_check_topk", -4, 2048)

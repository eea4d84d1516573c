"""Kernel files as third parties write them: importing modules that sit beside them."""

from __future__ import annotations

import textwrap
from pathlib import Path

from elasticbench.harness.registry import load_kernel_file

SIBLING = Path(__file__).resolve().parents[2] / "fixtures" / "sibling" / "lowp_softmax.py"


def test_a_kernel_file_imports_a_module_beside_it(cli):
    r = cli("verify", "--quick", "--kernel-file", str(SIBLING), "-d", "fp32", "--input", "normal")
    assert r.code == 0, r.err
    assert "lowp_softmax" in r.out and "0 failed" in r.out


def _write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_file_given_and_imported_by_another_registers_once(tmp_path):
    # b imports a by name; given as kernel files in either order, a's kernel is a's, once.
    a = _write(tmp_path / "kf_sib_a.py", """
        from elasticbench import register_kernel

        @register_kernel(function="softmax", backend="numpy", name="kf_sib_a")
        def kf_sib_a(x):
            return x.copy()
        """)
    b = _write(tmp_path / "kf_sib_b.py", """
        from kf_sib_a import kf_sib_a
        from elasticbench import register_kernel

        @register_kernel(function="softmax", backend="numpy", name="kf_sib_b")
        def kf_sib_b(x):
            return kf_sib_a(x)
        """)
    assert [k.name for k in load_kernel_file(a)] == ["kf_sib_a"]
    assert [k.name for k in load_kernel_file(b)] == ["kf_sib_b"]  # a not executed again


def test_a_file_imported_first_by_another_can_still_be_given(tmp_path):
    a = _write(tmp_path / "kf_sib_c.py", """
        from elasticbench import register_kernel

        @register_kernel(function="softmax", backend="numpy", name="kf_sib_c")
        def kf_sib_c(x):
            return x.copy()
        """)
    b = _write(tmp_path / "kf_sib_d.py", """
        import kf_sib_c
        """)
    assert [k.name for k in load_kernel_file(b)] == ["kf_sib_c"]
    assert [k.name for k in load_kernel_file(a)] == ["kf_sib_c"]  # not "already registered"


def test_scoped_kernels_forget_what_the_block_registers(tmp_path):
    from elasticbench.harness.registry import get_kernel, list_kernels, scoped_kernels

    path = _write(tmp_path / "kf_scoped.py", """
        from elasticbench import register_kernel

        @register_kernel(function="softmax", backend="numpy", name="kf_scoped")
        def kf_scoped(x):
            return x.copy()
        """)
    before = list_kernels()
    with scoped_kernels(alone=True):
        assert list_kernels() == []  # the built-ins are hidden inside an `alone` block
        [spec] = load_kernel_file(path)
        assert list_kernels() == [spec]
    assert list_kernels() == before
    with scoped_kernels():
        load_kernel_file(path)
        assert get_kernel("kf_scoped").source == path and len(list_kernels()) == len(before) + 1
    assert "kf_scoped" not in {k.name for k in list_kernels()}

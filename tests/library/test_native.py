"""The native C++ tier: it builds, every instruction-set build agrees with the reference
kernels on ordinary and special rows, long rows split across threads agree with whole rows,
elasticbench.functional uses it, and a machine without a compiler is told why in one line."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from elasticbench import functional as F
from elasticbench import native
from elasticbench.rows.exp_normalize import exp_normalize_backward, exp_normalize_forward
from elasticbench.rows.spec import ExpSpec
from elasticbench.rows.tiers import choose

TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.needs("native")
def test_the_tier_builds_wherever_a_compiler_exists():
    """A compile error in the project's own sources fails here, with the compiler's line."""
    assert native.unavailable() is None


@pytest.fixture(scope="module")
def ext():
    """The built extension: tests that take it are marked needs("native")."""
    module = native.load()
    yield module
    module.set_isa(module.isas()[0])


def _structures(ext) -> list:
    """The forward's pass structures, in table.h's order (three-pass, online, fused, accurate)."""
    return sorted(ext.Structure.__members__.values(), key=int)


def _rows(dtype: torch.dtype, n: int) -> torch.Tensor:
    """Ordinary rows (odd n: a vector tail) and one row of each special kind."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(9, n, generator=g, dtype=torch.float64) * 4
    x[1, n // 2] = math.nan
    x[2, [0, n - 1]] = math.inf
    x[3] = -x[3].abs() - 1  # nothing kept by elastic
    x[4] = -math.inf
    x[5, : n // 2] = 0.0
    x[6, 1::2] = -0.0
    x[7] = x[7] * 30
    return x.to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got == 0, want.to(dtype) == 0), "zeros must be exactly where they belong"
    g, w = got.double().nan_to_num(0), want.double().nan_to_num(0)
    tiny = torch.finfo(dtype).tiny
    assert ((g - w).abs() / w.abs().clamp_min(tiny)).max().item() <= TOL[dtype]


@pytest.mark.needs("native")
@pytest.mark.parametrize("dtype", list(TOL))
def test_every_instruction_set_matches_the_reference(ext, dtype):
    for isa in ext.isas():
        ext.set_isa(isa)
        for n in (1, 37, 1500):
            x = _rows(dtype, n)
            xd, before = x.double(), x.clone()
            elastic = exp_normalize_forward(xd, xd >= 0, 0.5, 0.25)
            for structure in _structures(ext):
                if dtype in (torch.float16, torch.bfloat16) and structure == ext.Structure.ACCURATE:
                    continue  # fp64 and fp32 only
                _close(ext.exp_forward(x, structure, True, -math.inf, 0.5, 0.25), elastic, dtype)
            _close(ext.exp_forward(x, ext.Structure.FUSED, False, 0.0, 1.0, 1.0),
                   exp_normalize_forward(xd, xd > -math.inf, 1.0, 1.0, 0.0), dtype)
            w = xd.abs()
            at_inf = (w == math.inf).double()
            symax = torch.where(at_inf.any(-1, keepdim=True), at_inf / at_inf.sum(-1, keepdim=True),
                                w / (w.nan_to_num(0).sum(-1, keepdim=True) + 1))
            symax[xd.isnan().any(-1)] = math.nan
            _close(ext.weight_forward(x, True, 1.0), symax, dtype)
            gr = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            y = elastic.to(dtype)
            dx, dtau, dbeta = exp_normalize_backward(xd, y.double(), gr.to(dtype).double(),
                                                     xd >= 0, 0.5, 0.25, params=True)
            ndx, ndtau, ndbeta = ext.exp_backward(x, y, gr.to(dtype), True, 0.5, 0.25, True)
            # dx = y (g - c)/tau cancels where g ~ c: bound the error by the terms' sizes
            gd, yd = gr.to(dtype).double(), y.double().nan_to_num(0)
            c = (gd * yd).abs().sum(-1, keepdim=True)
            fi = torch.finfo(dtype)  # plus the output's own rounding, subnormals included
            bound = 8 * TOL[dtype] * yd.abs() * (gd.abs() + c) / 0.5 + fi.eps * dx.abs() \
                + fi.tiny * fi.eps
            assert torch.equal(ndx.isnan(), dx.isnan()), isa
            assert (((ndx.double() - dx).abs() <= bound) | dx.isnan()).all(), isa
            assert torch.allclose(ndtau, dtau.squeeze(-1), rtol=1e-4, atol=1e-6, equal_nan=True)
            assert torch.allclose(ndbeta, dbeta.squeeze(-1), rtol=1e-4, atol=1e-9, equal_nan=True)
            assert torch.equal(x, before) or torch.equal(x.isnan(), before.isnan())


@pytest.mark.needs("native")
@pytest.mark.parametrize("shape", [(3, 1 << 18), (1, 1 << 20)])
def test_long_rows_split_across_threads_agree_with_whole_rows(ext, shape):
    """On two threads, rows of 2^18 (1 MiB) are taken by both threads together, row by row,
    where the L2 holds half a row's x and y but not the whole (a one-thread run does them
    whole); one row of 2^20 takes the two-phase path."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=gen) * 3
    x[-1, 5] = -math.inf
    if shape[0] > 1:
        x[1, -5] = math.inf
        x[2, -7] = math.nan
    g = torch.randn(x.shape, generator=gen)
    threads = torch.get_num_threads()
    try:
        out = {}
        for t in (1, 2):
            torch.set_num_threads(t)
            out[t] = [ext.exp_forward(x, s, True, -math.inf, 0.7, 0.5) for s in _structures(ext)]
            out[t] += [ext.weight_forward(x, False, 0.0)]
            y = out[t][0]
            out[t] += list(ext.exp_backward(x, y, g, True, 0.7, 0.5, True))
            out[t] += ext.exp_backward(x, y, g, True, 0.7, 0.5, False)[:1]
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(out[1], out[2], strict=True):
        # dx = y (g - <y, g>) / tau cancels where g is near <y, g>: a sum taken in another
        # order moves small dx by a share of the largest, not of themselves
        scale = two.double().nan_to_num(0.0, 0.0, 0.0).abs().max().item()
        assert torch.allclose(one.double(), two.double(), rtol=1e-5, atol=max(1e-12, 1e-6 * scale),
                              equal_nan=True)
    # every structure agrees with the three-pass one (the fused kernels keep such rows' exps
    # apart from y); the arguments (x - m)/tau round differently with each block's shift, by
    # |z| 2^-24 relative, and |z| reaches 40 here
    for structure in range(1, len(_structures(ext))):
        for t in (1, 2):
            assert torch.allclose(out[t][structure], out[t][0], rtol=1e-5, atol=1e-30,
                                  equal_nan=True), (structure, t)
    if shape[0] > 1:
        assert out[2][0][2].isnan().all()
        assert out[2][0][1][-5] == 1.0 and out[2][0][1].sum() == 1.0


@pytest.mark.needs("native")
def test_functional_and_nn_run_the_native_kernels(ext):
    x = torch.randn(4, 6, 33, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert choose(x, ExpSpec(True, tau=tau.detach(), offset=beta.detach())).name == "cpp"
    y = F.elastic_softmax(x, tau, beta, dim=1)
    direct = ext.exp_forward(x.detach().movedim(1, -1), ext.Structure.FUSED, True, -math.inf,
                             0.7, 0.3)
    assert torch.equal(y.detach(), direct.movedim(-1, 1))
    assert torch.autograd.gradcheck(lambda a, t, b: F.elastic_softmax(a, t, b, dim=1), (x, tau, beta))
    assert torch.autograd.gradcheck(lambda a: F.softmax1(a, dim=0), (x,))
    per_row = ExpSpec(True, tau=torch.ones(6, 1, 1), offset=0.3)
    assert choose(x, per_row).name == "cpp"  # per-row tau: the native kernels too
    per_head = torch.full((6, 1), 0.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, t: F.elastic_softmax(a, t, 0.3, dim=2),
                                    (x, per_head))


def test_without_a_compiler_the_backend_says_why_in_one_line(tmp_path):
    env = dict(os.environ, CXX=str(tmp_path / "no-such-c++"), ELASTICBENCH_BUILD_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "elasticbench", "list", "backends"]
    listing = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    line = next(ln for ln in listing.stdout.splitlines() if ln.startswith("cpp"))
    assert "not available here" in line and "no C++ compiler" in line
    built = subprocess.run([sys.executable, "-m", "elasticbench.native"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0 and "skipped, no C++ compiler" in built.stdout


def test_two_copies_of_the_same_sources_never_share_a_build_directory(tmp_path, monkeypatch):
    """An installed wheel and a checkout hold byte-identical sources; torch writes absolute
    source paths into the build directory's ninja file, so one directory for both would
    rebuild on every switch between them. The key covers the sources' directory too."""
    copies = [tmp_path / "checkout" / "cpp", tmp_path / "site-packages" / "cpp"]
    for copy in copies:
        shutil.copytree(native.source_dir(), copy)
    keys = []
    for copy in copies:
        monkeypatch.setattr(native, "source_dir", lambda copy=copy: copy)
        keys.append(native.build_key())
        assert native.build_key() == keys[-1]  # the same copy: the same directory, every time
    assert keys[0] != keys[1]
    (copies[1] / "rows.h").write_text((copies[1] / "rows.h").read_text() + "\n")
    assert native.build_key() != keys[1]  # and an edited header in the same place: a new one


def test_the_first_compiler_error_is_the_reason():
    log = "ninja: build stopped\n/src/rows.h:12:3: error: 'vexp' was not declared\nmore"
    assert native._first_error(log) == "/src/rows.h:12:3: error: 'vexp' was not declared"


@pytest.mark.needs("native")
def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_load(ext, tmp_path):
    """torch's build lock is a plain file: a build killed halfway leaves it, and torch then
    waits for it forever. Loads hold an flock instead and clear such a leftover. (On a copy
    of the build directory: a lock file in the shared one would stall concurrent loads.)"""
    key = native.build_key()
    # copy2: ninja sees both current (the command builds the harness's reference extension
    # too, which would otherwise compile from nothing and outlast the timeout on a busy machine)
    for k in (key, native.build_key(native.REFERENCE)):
        if (native.build_root() / k).is_dir():
            shutil.copytree(native.build_root() / k, tmp_path / k)
    stale = tmp_path / key / "lock"
    stale.touch()
    env = dict(os.environ, ELASTICBENCH_BUILD_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "elasticbench.native"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "built for" in done.stdout, done.stderr
    assert not stale.exists()


@pytest.mark.needs("native")
def test_backward_without_parameter_gradients_reads_x_only_where_y_cannot_tell(ext):
    """y alone settles a row with two different nonzero outputs; a +inf row (outputs 1/k),
    a one-hot or tied finite row and a NaN row need x, and get it."""
    inf, nan = math.inf, math.nan
    x = torch.tensor([[inf, inf, 1.0, -2.0],    # +inf row: y = 1/2 at the infinities, dx = 0
                      [3.0, 3.0, -1.0, -5.0],   # finite ties, same y: dx = y (g - c)
                      [nan, 1.0, 2.0, 0.0],     # NaN row: dx NaN
                      [0.5, 2.0, -1.0, 1.0]])   # plain finite row
    g = torch.tensor([[1.0, -2.0, 0.5, 4.0], [1.0, -2.0, 0.5, 4.0],
                      [1.0, 1.0, 1.0, 1.0], [0.3, -1.0, 2.0, 0.7]])
    for isa in ext.isas():
        ext.set_isa(isa)
        y = ext.exp_forward(x, ext.Structure.FUSED, True, -math.inf, 1.0, 0.0)
        assert torch.equal(y[0], torch.tensor([0.5, 0.5, 0.0, 0.0])) and torch.equal(y[1], y[0])
        dx = ext.exp_backward(x, y, g, True, 1.0, 0.0, False)[0]
        assert torch.equal(dx[0], torch.zeros(4)), isa
        assert torch.allclose(dx[1], torch.tensor([0.75, -0.75, 0.0, 0.0])), isa
        assert dx[2].isnan().all(), isa
        want = y[3] * (g[3] - (g[3] * y[3]).sum())
        assert torch.allclose(dx[3], want, rtol=1e-6, atol=1e-7), isa
        with_params = ext.exp_backward(x, y, g, True, 1.0, 0.0, True)[0]
        assert torch.equal(dx.isnan(), with_params.isnan())
        assert torch.allclose(dx.nan_to_num(), with_params.nan_to_num(), rtol=1e-6, atol=1e-7)
    ext.set_isa(ext.isas()[0])


def test_the_exponential_polynomial_is_the_one_the_script_derives():
    """simd.h's EXP_POLY6 holds exactly scripts/exp_polynomial.py's coefficients, and that
    polynomial is within 2^-26 of exp (relative) on the reduced range, in fp32 too."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("exp_polynomial", root / "scripts" / "exp_polynomial.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    coef, err, err_float = script.coefficients()
    header = (root / "kernels" / "cpp" / "simd.h").read_text()
    table = re.search(r"EXP_POLY6\[7\] = \{([^}]*)\}", header).group(1)
    assert [float.fromhex(c.strip()) for c in table.split(",")] == coef
    assert coef[:2] == [1.0, 1.0] and max(err, err_float) < 2.0**-26


@pytest.mark.needs("native")
def test_dtau_sums_follow_a_max_that_grows_in_every_block(ext):
    """Pass 1 forms sum y (x - r) and sum g y (x - r) against the running max r and shifts
    them when r grows: rows rising block after block (and one rising, then falling) with a
    wide tau, so that y is nonzero over many blocks, give the reference's dtau; the rows
    split over both threads merge their segments' sums the same way."""
    gen = torch.Generator().manual_seed(5)
    n = 9000
    rising = torch.linspace(0.0, 60.0, n, dtype=torch.float64)
    x = torch.stack([rising, torch.cat([rising[: n // 2], rising[: n // 2].flip(0)]),
                     rising + torch.randn(n, generator=gen, dtype=torch.float64)])
    x[2, ::7] = -1.0  # masked positions between the kept ones
    g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        xt, gt = x.to(dtype), g.to(dtype)
        xd = xt.double()
        y = exp_normalize_forward(xd, xd >= 0, 8.0, 0.5).to(dtype)
        _, dtau, dbeta = exp_normalize_backward(xd, y.double(), gt.double(), xd >= 0, 8.0, 0.5,
                                                params=True)
        for isa in ext.isas():
            ext.set_isa(isa)
            _, ndtau, ndbeta = ext.exp_backward(xt, y, gt, True, 8.0, 0.5, True)
            assert torch.allclose(ndtau, dtau.squeeze(-1), rtol=1e-5, atol=1e-9), (isa, dtype)
            assert torch.allclose(ndbeta, dbeta.squeeze(-1), rtol=1e-5, atol=1e-12), (isa, dtype)
    ext.set_isa(ext.isas()[0])


@pytest.mark.needs("native")
def test_the_exp_probe_sums_exponentials_on_every_instruction_set(ext):
    """The roofline's native exp+sum probe is the row kernels' exp: sum exp(x), x <= 0."""
    x64 = torch.linspace(-30, 0, 100_003, dtype=torch.float64)  # a tail past every width
    for isa in ext.isas():
        ext.set_isa(isa)
        for dtype, rel in ((torch.float64, 1e-12), (torch.float32, 1e-5),
                           (torch.float16, 1e-5), (torch.bfloat16, 1e-5)):
            x = x64.to(dtype)
            want = torch.exp(x.double()).sum().item()
            assert ext.exp_sum(x) == pytest.approx(want, rel=rel), (isa, dtype)
    ext.set_isa(ext.isas()[0])


@pytest.mark.needs("native")
def test_the_host_roofline_takes_the_native_probe_instead_of_inductor(ext):
    from elasticbench.harness.bench.runner import measure_ceilings
    from elasticbench.harness.bench.timing import Policy

    c = measure_ceilings("cpu", ["fp32"], Policy(min_reps=3, max_reps=3, budget_s=0.05))
    probes = {d: t.get("probe") for d, t in c.detail["exp_timing"].items()}
    assert set(probes) == {"fp32", "fp64"}
    assert all(p in ("torch.exp", "cpp exp+sum") for p in probes.values()), probes
    # a rate was measured for each (its size is the machine's and its load's: no bound here)
    assert all(math.isfinite(r) and r > 0 for r in c.exp_eps.values()), c.exp_eps


@pytest.mark.needs("native")
@pytest.mark.parametrize("params", ["floats", "scalar", "per_row"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_native_autograd_function_is_the_python_one_bit_for_bit(params, dtype):
    """Eager calls on CPU tensors run the native tier's C++ autograd function (exp_rows): the
    same output and gradients, bit for bit, as the Python autograd function running the same
    kernels (docs/dispatch.md section 3), and exact second orders through the torch code."""
    from elasticbench.rows import native_rows, ops
    from elasticbench.rows.spec import ELASTIC

    wd = torch.float64 if dtype == torch.float64 else torch.float32
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 3, 17, generator=gen) * 3).to(dtype)
    x[0, 1, :] = -1.0  # a row that keeps nothing
    g = torch.randn(2, 3, 17, generator=gen).to(dtype)
    if params == "floats":
        tau, beta = 0.6, 0.4
    else:
        shape = () if params == "scalar" else (3, 1)
        tau = (torch.rand(shape, generator=gen) + 0.3).to(wd)
        beta = torch.rand(shape, generator=gen).to(wd)

    def grads(native_path: bool):
        xs = x.clone().requires_grad_()
        ps = [p.clone().requires_grad_() if isinstance(p, torch.Tensor) else p
              for p in (tau, beta)]
        if native_path:
            y = F.elastic_softmax(xs, *ps)
        else:
            t, b = (p if not isinstance(p, torch.Tensor) else p.reshape(p.shape)
                    for p in ps)
            y = ops._ExpFamily.apply(xs, t, b, True, -math.inf, native_rows.CPP)
        leaves = [xs, *(p for p in ps if isinstance(p, torch.Tensor))]
        return y, torch.autograd.grad(y, leaves, g)

    assert choose(x, ELASTIC).name == "cpp"
    (y1, g1), (y2, g2) = grads(True), grads(False)
    assert torch.equal(y1, y2)
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a, b)
    if dtype == torch.float64 and params != "floats":
        xs = x.clone().requires_grad_()
        t = tau.clone().requires_grad_()
        assert torch.autograd.gradgradcheck(lambda a, b: F.elastic_softmax(a, b, beta), (xs, t))


@pytest.mark.needs("native")
def test_the_modules_parameters_are_one_native_node_with_the_composites_values():
    from elasticbench.nn import LOG_SCALE_LIMIT, ElasticSoftmax, _scale

    m = ElasticSoftmax(tau=0.7, beta=0.2, param_shape=(3, 1)).double()
    with torch.no_grad():
        m.log_tau_scale.copy_(torch.tensor([[0.5], [-50.0], [0.0]]))  # one past the clamp
    tau, beta = m.params()
    assert "ScaledParams" in tau.grad_fn.name()
    want_tau = _scale(m.tau0, m.log_tau_scale)
    assert torch.equal(tau, want_tau) and torch.equal(beta, _scale(m.beta0, m.log_beta_scale))
    (tau * torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)).sum().backward()
    got = m.log_tau_scale.grad.clone()
    m.zero_grad()
    (want_tau * torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)).sum().backward()
    assert torch.equal(got, m.log_tau_scale.grad) and got[1, 0] == 0  # the clamp stops it
    assert LOG_SCALE_LIMIT == 40.0


@pytest.mark.needs("native")
@pytest.mark.parametrize(("shape", "param_shape", "dtype"), [
    ((8, 1024), (), torch.float32),  # the common module: one tau and beta
    ((2, 3, 5, 7), (3, 1, 1), torch.float64),  # per head
    ((2, 3, 5, 7), (2, 3, 1, 1), torch.bfloat16),  # per (batch, head)
])
def test_the_module_as_one_native_node_is_elastic_softmax_of_its_parameters(shape, param_shape,
                                                                          dtype):
    """ElasticSoftmax's eager CPU call forms tau and beta inside one native autograd node
    (elastic_scaled): its output and the gradients of x and both log-scales are, bit for
    bit, elastic_softmax's with the module's params(), and its second order is theirs."""
    from elasticbench.nn import ElasticSoftmax

    gen = torch.Generator().manual_seed(6)
    m = ElasticSoftmax(tau=0.7, beta=0.3, param_shape=param_shape)
    if dtype == torch.float64:
        m = m.double()
    with torch.no_grad():  # log-scales away from 0, one of them past the clamp
        m.log_tau_scale.add_(torch.randn(param_shape, generator=gen).to(m.log_tau_scale) * 0.3)
        m.log_beta_scale.add_(torch.randn(param_shape, generator=gen).to(m.log_tau_scale) * 0.3)
        m.log_beta_scale.view(-1)[0] = 45.0
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).requires_grad_()
    g = torch.randn(shape, generator=gen).to(dtype)
    leaves = (x, m.log_tau_scale, m.log_beta_scale)
    y = m(x)
    assert "ElasticScaled" in y.grad_fn.name()
    want = F.elastic_softmax(x, *m.params())
    assert torch.equal(y, want)
    for a, b in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(want, leaves, g),
                    strict=True):
        assert torch.equal(a, b)
    if dtype == torch.float64:
        first = [torch.autograd.grad(out.pow(2).sum(), (x,), create_graph=True)[0].sum()
                 for out in (m(x), F.elastic_softmax(x, *m.params()))]
        for a, b in zip(*(torch.autograd.grad(f, leaves) for f in first), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)

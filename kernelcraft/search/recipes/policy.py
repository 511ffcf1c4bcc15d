"""The `recipes` policy: offline search over compositions of known transformations of the reference.

A recipe is a set of tokens (`rewrite:RULE`, `triton`, `compile:MODE`, `cudagraph`, `channels_last`,
`cudnn_benchmark`, `tuned`, `tuned_gemm`, `bf16` only with `--allow-precision-change`); only tokens that apply to this
reference and device are offered, and `valid` excludes conflicting ones. Proposals are scored by an additive
model driven by the contrastive exemplars; a token that failed alone is not used again; on a GPU the baselines are
measured before anything else is proposed. Strict mode is refused.
`thread_safe`: the only state kept is each reference's analysis, under a lock.
Rationale: docs/design/recipes.md#policy
"""
from __future__ import annotations

import itertools
import math
import threading

from kernelcraft.search.recipes import render, rewrite, tunable, tunetemplates
from kernelcraft.search.policies import Context, PolicyError, Proposal
from kernelcraft.search.techniques import techniques

COMPILE = [f"compile:{m}" for m in render.COMPILE_MODES]
GPU_ONLY = {"cudagraph", "compile:reduce-overhead", "compile:max-autotune", "cudnn_benchmark", "triton", "tuned",
            "tuned_gemm"}
NOT_WITH_GEMM = {"triton", "tuned", "bf16"}  # nor compile:*: each rewrites the GEMM regions' code its own way
PRECISION = {"bf16"}
CONV_ONLY = {"channels_last", "cudnn_benchmark"}
BASELINES = {"cuda": ["compile:default", "cudagraph"], "cpu": ["compile:default"]}

# Prior guesses of ln(speedup) of each token alone, by device kind.
GRAPH_SAFE_MODES = {"compile:default", "compile:max-autotune-no-cudagraphs"}  # compose with `cudagraph`
SIMPLIFY_PRIORS = {"rewrite:size1_reduce": 0.3, "rewrite:sink_pointwise": 0.2, "rewrite:clamp_chain": 0.15,
                   "rewrite:fuse_activation": 0.15, "rewrite:identities": 0.1, "rewrite:pool_merge": 0.1}

# `rewrite:attention`: attention as one fused kernel, the L x S scores never written (eager writes and reads them
# 4-6 times)
PRIORS = {
    "cuda": {**SIMPLIFY_PRIORS, "rewrite:attention": 1.0, "rewrite:diag_matmul": 2.0, "rewrite:reduce_linear": 2.0,
             "rewrite:pool_linear": 1.5,
             "rewrite:conv_reduce": 2.0, "rewrite:dead_code": 0.3,
             "rewrite:fold_scalars": 0.2, "rewrite:inplace": 0.05, "triton": 0.25, "compile:default": 0.3,
             "compile:max-autotune-no-cudagraphs": 0.3, "compile:max-autotune": 0.35,
             "compile:reduce-overhead": 0.4, "cudagraph": 0.3, "channels_last": -0.97, "cudnn_benchmark": 0.02,
             "bf16": 0.6, "tuned": 0.65, "tuned_gemm": 0.62},
    "cpu": {**SIMPLIFY_PRIORS, "rewrite:attention": 0.5, "rewrite:diag_matmul": 2.0, "rewrite:reduce_linear": 2.0,
            "rewrite:pool_linear": 1.5,
            "rewrite:conv_reduce": 2.0, "rewrite:dead_code": 0.3,
            "rewrite:fold_scalars": 0.15, "rewrite:inplace": 0.05, "channels_last": 0.1, "compile:default": 0.08,
            "compile:max-autotune-no-cudagraphs": 0.04, "bf16": 0.0},
}
# `triton` whose kernels replace a reduction, a pooling or a loss (a region with `reduce`: dimreduce, pooling, a fused
# reduction epilogue) rather than only fuse elementwise ops: a template kernel in place of a library call, ranked as
# `tuned` is (eager's poolings ran at 6-24% of an H200's memory bandwidth; docs/design/recipes.md#policy)
TRITON_TEMPLATE_PRIOR = 0.65
# ...but not beside a convolution or a matrix product left to cuDNN or cuBLAS: there the template is a tail that
# inductor fuses as well or better (level 2 on an H200: 0.97-1.11 against compile's 0.95-1.94 on 4 of 4 chains)
GEMM_OPS = {"Linear", "Bilinear", *rewrite.GEMM_FUNCTIONS}  # module type names and function names, as in `ops`
# `cudnn_benchmark` on a net with a 3-D (transposed) convolution: cuDNN's default algorithm there was 1.9x slower
# (geomean, 9 fp32 tasks on an H200) than the one its benchmark picks; on 1-D and 2-D ones 1.02x
# (`PRIORS["cuda"]`, 18 tasks), and `channels_last` alone 0.38x on fp32 2-D ones (docs/design/recipes.md#policy)
CUDNN_BENCHMARK_3D_PRIOR = 0.65
FAIL_PENALTY = 0.5
BASELINE_BONUS = 0.5  # baselines are tried early: the search must never lose to them
# where CUDA graphs alone lost, a recipe that captures one, made of measured tokens, whose additive estimate is below
# the best measured by more than this (ln 1.1) is not proposed: of 98 such recipes measured on levels 1 and 2 on an
# H200 it leaves out 53, none within 2% of the best of the rest of its search (docs/design/recipes.md#policy)
LOSS_MARGIN = math.log(1.1)
# compile modes that capture CUDA graphs themselves, and the mode they equal without the capture: once `cudagraph`
# alone is measured, such a mode's unmeasured effect is that mode's plus the capture's (on a task with large inputs
# the capture's copies into static buffers cost more than launches: 0.4-0.98x on level 1's tasks on an H200)
GRAPH_MODES = {"compile:reduce-overhead": "compile:default", "compile:max-autotune": "compile:max-autotune-no-cudagraphs"}
GRAPH_TOKENS = {"cudagraph", *GRAPH_MODES}
# the max-autotune modes benchmark every distinct convolution and matrix-product problem of the model
# (`autotune_shapes`) in their first call: 6-90 s for one on an H200 (median 12 s, 11 tasks of levels 1-2), 17-55 s
# per GEMM on an H100; a network with more than this many spends the judge's 300 s first-call limit compiling
# (docs/design/recipes.md#policy)
MAX_AUTOTUNE_SHAPES = 4
AUTOTUNE_MODES = {"compile:max-autotune", "compile:max-autotune-no-cudagraphs"}


def _unreproduced(row) -> bool:
    """Rejected only because a fresh worker timed it differently (autotuning, noise): the recipe was
    correct, so its token is not to blame the way a wrong or crashing one is."""
    return row.status == "rejected" and list(row.reasons or []) == ["suspicious_speedup"]


class RecipesPolicy:
    name = "recipes"
    thread_safe = True  # see docs/design/recipes.md#policy

    def __init__(self, *, analysis: rewrite.Analysis | None = None, skip=(), **_):
        """`skip`: tokens or token prefixes never to use (e.g. "compile" on a slow CPU). `analysis`: the one to
        use whatever the task (tests); by default each task's reference is analysed once, when first seen."""
        self._fixed = analysis
        self._analyses: dict[str, rewrite.Analysis] = {}  # task SHA-256 -> its analysis
        self._lock = threading.Lock()
        self.skip = tuple(s for s in (skip.split(",") if isinstance(skip, str) else skip or ()) if s)

    # -- what applies ------------------------------------------------------------------------------
    def analysis(self, ctx: Context) -> rewrite.Analysis:
        if self._fixed is not None:
            return self._fixed
        with self._lock:
            a = self._analyses.get(ctx.task.sha256)
        if a is None:  # a subprocess, run outside the lock: other tasks' proposals need not wait for it
            a = rewrite.analyze(ctx.task.source)
            with self._lock:
                a = self._analyses.setdefault(ctx.task.sha256, a)
        return a

    def tokens(self, ctx: Context) -> list[str]:
        a = self.analysis(ctx)
        kind = ctx.device.kind
        toks = [f"rewrite:{r}" for r in a.rules] + COMPILE + ["cudagraph", "channels_last", "cudnn_benchmark",
                                                              "triton", "bf16"] + (["tuned"] if a.tunable else [])
        if not a.tunable and any(v.get("gemm") for v in a.variants.values()):  # a whole template is `tuned`'s
            toks.append("tuned_gemm")
        out = []
        for t in toks:
            if kind != "cuda" and t in GPU_ONLY:
                continue
            if t in PRECISION and not ctx.allow_precision_change:
                continue
            if t in CONV_ONLY and not a.features.get("conv"):
                continue
            if t == "channels_last" and (not a.features.get("conv2d") or a.features.get("conv3d")):
                continue  # 4-D only: `module.to(channels_last)` raises on a Conv3d's 5-D weight
            if t == "triton" and not any(v.get("triton") for v in a.variants.values()):
                continue
            if t in AUTOTUNE_MODES and self._autotune_shapes(a) > MAX_AUTOTUNE_SHAPES:
                continue
            if self._skipped(t):
                continue
            if t in PRIORS[kind]:
                out.append(t)
        return out

    def _skipped(self, token: str) -> bool:
        return any(token == s or token.startswith(s.rstrip(":") + ":") for s in self.skip)

    @staticmethod
    def _autotune_shapes(a: rewrite.Analysis) -> int:
        return int(a.features.get("autotune_shapes") or 0)

    def valid(self, recipe: frozenset, ctx: Context) -> bool:
        if not recipe:
            return False
        a = self.analysis(ctx)
        if "tuned" in recipe:  # the whole forward is one tuned Triton kernel: nothing composes with it
            return len(recipe) == 1 and bool(a.tunable)
        modes = [t for t in recipe if t.startswith("compile:")]
        if "tuned_gemm" in recipe and (modes or recipe & NOT_WITH_GEMM):
            return False  # the regions' kernels are fixed: with cudagraph and rewrites only
        if len(modes) > 1 or (modes and "triton" in recipe):
            return False  # the compiler fuses elementwise ops itself
        if modes and "cudagraph" in recipe and modes[0] not in GRAPH_SAFE_MODES:
            return False  # this mode captures CUDA graphs itself
        rules = [t.split(":", 1)[1] for t in recipe if t.startswith("rewrite:")]
        if rules or "triton" in recipe or "tuned_gemm" in recipe:
            v = a.variant(rules)
            if v is None or ("triton" in recipe and not v.get("triton")) or ("tuned_gemm" in recipe and not v.get("gemm")):
                return False
        return True

    def render(self, recipe, ctx: Context) -> str:
        return self.render_noted(recipe, ctx)[0]

    def render_noted(self, recipe, ctx: Context) -> tuple[str, str | None]:
        """(the candidate source, a line for people on what it is where there is more to say than its tokens: for
        `tuned`, the template, its size and where its configuration came from)."""
        a = self.analysis(ctx)
        if "tuned" in recipe:
            match = tunable.Match.from_json(a.tunable[0])
            config, origin = tunable.lookup_config(match.kernel, match.shape, gpu=ctx.device.name)
            note = (f"template: {tunable.describe(match)}; configuration {tunable.config_key(config)} "
                    f"({origin if origin != 'default' else 'the template default: nothing tuned near this shape'})")
            return tunetemplates.candidate_source(ctx.task.source, match, config, note=origin), note
        return render.render(ctx.task.source, sorted(recipe), a, output_dtypes=a.features.get("output_dtypes"),
                             gpu=ctx.device.name), None

    def exhausted(self, ctx: Context) -> str:
        """Why `propose` returned nothing: which recipes apply here, and what would add more."""
        usable = self.tokens(ctx)
        seen, effect, banned, measured = self._effects(ctx)
        tried = sum(1 for r in ctx.history if (r.meta or {}).get("recipe") is not None)
        more = []
        if ctx.device.kind != "cuda":
            more.append("CUDA graphs, Triton and the GPU compile modes need a GPU")
        shapes = self._autotune_shapes(self.analysis(ctx))
        if shapes > MAX_AUTOTUNE_SHAPES and not all(self._skipped(t) for t in AUTOTUNE_MODES):
            more.append(f"torch.compile's max-autotune modes are left out: they would autotune {shapes} distinct "
                        f"convolution and matrix-product problems (more than {MAX_AUTOTUNE_SHAPES}) in the first call")
        if not ctx.allow_precision_change:
            more.append("--allow-precision-change adds bf16")
        more.append("an LLM policy (--policy openai:MODEL) writes new code")
        losing = self._measured_loss(seen, effect, measured)
        left = [r for r in (frozenset(c) for n in range(1, len(measured) + 1) for c in
                            itertools.combinations(sorted(measured), n))
                if r not in seen and not r & banned and self.valid(r, ctx) and losing(r)]
        return (f"the recipes policy tried every valid combination ({tried}) of the {len(usable)} recipe(s) that "
                f"apply to this task on {ctx.device.kind}: {', '.join(usable) or 'none'}"
                + (f" (failed alone, so left out: {', '.join(sorted(banned))})" if banned else "")
                + (f", but for {len(left)} capturing CUDA graphs, which lost alone, whose tokens' measured speedups "
                   f"multiply to 10%+ below the best "
                   f"({', '.join('+'.join(sorted(r)) for r in left[:3])}{', ...' if len(left) > 3 else ''})"
                   if left else "")
                + "; " + "; ".join(more))

    # -- the search --------------------------------------------------------------------------------
    def propose(self, ctx: Context) -> list[Proposal]:
        if ctx.mode == "strict":
            raise PolicyError("the recipes policy transforms the reference model, which strict mode forbids; "
                              "use an LLM policy (openai:MODEL, hf:PATH) with --mode strict")
        seen, effect, banned, measured = self._effects(ctx)
        usable = [t for t in self.tokens(ctx) if t not in banned]
        chosen: list[Proposal] = []
        taken: set[frozenset] = set()
        losing = self._measured_loss(seen, effect, measured)

        def offer(recipe: frozenset, parents, op) -> bool:
            if recipe in seen or recipe in taken or not self.valid(recipe, ctx) or recipe & banned or losing(recipe):
                return False
            try:
                source, note = self.render_noted(recipe, ctx)
            except ValueError:
                return False
            taken.add(recipe)
            toks = sorted(recipe)
            meta = {"recipe": toks, "operator": op, "techniques": techniques(None, {"recipe": toks})}
            if note:
                meta["note"] = note
            chosen.append(Proposal(source, parents=list(parents), meta=meta))
            return True

        scored = [row for row in seen.values() if row.correct]
        composite = self.composite(usable, ctx, effect)
        composite_est = sum(effect[t] for t in composite) if composite is not None else None
        baselines = {frozenset([t]) for t in BASELINES[ctx.device.kind] if t in usable}
        if ctx.device.kind == "cuda" and baselines and not baselines & set(seen):
            for recipe in sorted(baselines, key=sorted):  # on a GPU the baselines go first, alone: what CUDA graphs
                offer(recipe, [], "seed")  # cost on this task decides half the recipes (GRAPH_MODES, the composite)
            if chosen:
                return chosen[:ctx.k]
        if not scored or set(seen) <= baselines:  # the first round (after the GPU's baselines): single tokens and
            bonus = {t: BASELINE_BONUS for t in BASELINES[ctx.device.kind]}  # the composite, ranked by effect
            seeds = [(frozenset([t]), effect[t] + bonus.get(t, 0.0), "seed") for t in usable]
            if composite is not None:
                seeds.append((composite, composite_est, "compose"))
            for recipe, _, op in sorted(seeds, key=lambda c: (-c[1], sorted(c[0]))):
                if len(chosen) >= ctx.k:
                    break
                offer(recipe, [], op)
        elif composite is not None and len(chosen) < ctx.k and composite_est > max(
                math.log(max(r.speedup, 1e-6)) for r in scored):  # later: only while it promises a gain
            offer(composite, [], "compose")
        credit = {t: 0.0 for t in usable}
        attempts = 0
        while len(chosen) < ctx.k and attempts < 4 * ctx.k and scored:
            attempts += 1
            pair = [e for e in ctx.sample_exemplars() if e.meta.get("recipe") is not None]
            if not pair:
                break
            a_rec, a_score = frozenset(pair[0].meta["recipe"]), math.log(max(pair[0].speedup, 1e-6))
            b_rec = frozenset(pair[1].meta["recipe"]) if len(pair) > 1 else None
            if b_rec is not None:
                gap = a_score - math.log(max(pair[1].speedup, 1e-6))
                for t in a_rec - b_rec:
                    credit[t] = credit.get(t, 0.0) + gap
                for t in b_rec - a_rec:
                    credit[t] = credit.get(t, 0.0) - gap
            children = self._children(a_rec, b_rec, usable, ctx)
            parents = [pair[0].id] + ([pair[1].id] if b_rec is not None else [])

            def est(child, rec=a_rec, base=a_score):
                added, removed = child - rec, rec - child
                return (base + sum(effect.get(t, -9) + 0.5 * credit.get(t, 0.0) for t in added)
                        - sum(effect.get(t, 0) for t in removed) + 1e-3 * ctx.rng.random())

            for child, op in sorted(children, key=lambda c: -est(c[0])):
                if offer(child, parents if op == "combine" else parents[:1], op):
                    break
        if len(chosen) < ctx.k:  # explore: the best untried single tokens, then pairs with the best so far
            best = max(scored, key=lambda r: r.speedup, default=None)
            base = frozenset(best.meta["recipe"]) if best is not None else frozenset()
            pool = [(frozenset([t]), []) for t in usable]
            pool += [(base | {t}, [best.id]) for t in usable if best is not None]
            pool.sort(key=lambda c: -sum(effect.get(t, -9) for t in c[0]))
            for recipe, parents in pool:
                if len(chosen) >= ctx.k:
                    break
                offer(recipe, parents, "explore")
        return chosen

    def _effects(self, ctx: Context) -> tuple[dict, dict[str, float], set[str], set[str]]:
        """(the recipes tried: {recipe: row}, each usable token's effect (ln speedup: measured alone, else its prior,
        less FAIL_PENALTY per failed recipe holding it), the tokens banned (failed alone), the tokens whose effect
        is measured: alone, or a graph-capturing mode as its graph-free mode plus `cudagraph` measured)."""
        seen: dict[frozenset, object] = {}
        for row in ctx.history:
            rec = (row.meta or {}).get("recipe")
            if rec is not None:
                seen[frozenset(rec)] = row
        effect, banned, measured = {}, set(), set()
        for t in self.tokens(ctx):
            alone = seen.get(frozenset([t]))
            if alone is not None and alone.state == "done" and alone.correct:
                effect[t] = math.log(max(alone.speedup, 1e-6))
                measured.add(t)
            elif alone is not None and alone.state == "done" and not _unreproduced(alone):
                banned.add(t)
            else:
                effect[t] = self.prior(t, ctx)
        for rec, row in seen.items():
            if row.state == "done" and not row.correct:
                for t in rec:
                    if t in effect:
                        effect[t] -= FAIL_PENALTY / (4 if _unreproduced(row) else 1)
        if "cudagraph" in measured:
            for mode, plain in GRAPH_MODES.items():
                if mode in effect and frozenset([mode]) not in seen and plain in effect:
                    effect[mode] = effect[plain] + effect["cudagraph"]
                    measured.add(mode)  # what the capture costs here is measured
        return seen, effect, banned, measured

    @staticmethod
    def _measured_loss(seen: dict, effect: dict[str, float], measured: set[str]):
        """A test: does a recipe capture a CUDA graph where the capture alone measured a loss, hold only measured
        tokens, and add up to below the best measured speedup (eager's 1x at least) by more than LOSS_MARGIN? Such
        a recipe is not proposed (docs/design/recipes.md#policy). Only there: the estimate ranked graph recipes well
        on levels 1 and 2, while rewrites measured alone are too noisy to rule out their combinations."""
        best = max([0.0] + [math.log(max(r.speedup, 1e-6)) for r in seen.values() if r.state == "done" and r.correct])
        graphs_lose = "cudagraph" in measured and effect["cudagraph"] < 0

        def losing(recipe: frozenset) -> bool:
            return (graphs_lose and bool(recipe & GRAPH_TOKENS) and recipe <= measured
                    and sum(effect[t] for t in recipe) < best - LOSS_MARGIN)
        return losing

    def prior(self, token: str, ctx: Context) -> float:
        """The guessed ln(speedup) of `token` alone on this task: `PRIORS`, but `triton` as a template
        (`TRITON_TEMPLATE_PRIOR`) when a rendered variant's kernels replace a reduction, a pooling or a depthwise
        convolution, and no convolution or matrix product is left to a library call beside them."""
        if token == "triton" and ctx.device.kind == "cuda":
            a = self.analysis(ctx)
            reduces = [region["reduce"] for v in a.variants.values() if v.get("triton")
                       for region in v["triton"].get("regions") or [] if region.get("reduce")]
            library = {op for op in a.features.get("ops") or [] if "conv" in op.lower() or op in GEMM_OPS}
            if reduces and library <= {r.split()[-1] for r in reduces if r.startswith("depthwise")}:
                return TRITON_TEMPLATE_PRIOR
        if token == "cudnn_benchmark" and self.analysis(ctx).features.get("conv3d"):
            return CUDNN_BENCHMARK_3D_PRIOR
        return PRIORS[ctx.device.kind][token]

    def composite(self, usable: list[str], ctx: Context, effect: dict[str, float] | None = None) -> frozenset | None:
        """The largest rendered rewrite set, then compile:default, cudagraph and the conv nets' cudnn_benchmark and
        channels_last, each kept only if the recipe stays valid and the token is not a loss here: its `effect`
        (ln speedup measured alone, else its prior) at least 0, its prior above 0 without one
        (docs/design/recipes.md#policy); None when that is fewer than two tokens."""
        prior = PRIORS[ctx.device.kind]
        gains = (lambda t: effect[t] >= 0) if effect is not None else (lambda t: self.prior(t, ctx) > 0)
        compiled = "compile:default" in usable
        subsets = [frozenset(f"rewrite:{r}" for r in key.split("+")) for key in self.analysis(ctx).variants if key]
        subsets = [s for s in subsets if s <= set(usable) and not (compiled and "rewrite:inplace" in s)
                   and self.valid(s, ctx)]  # rendered variants only: not every subset is one (rewrite.py)
        recipe = max(subsets, key=lambda s: (len(s), sum(prior[t] for t in s), sorted(s)), default=frozenset())
        for t in ("compile:default", "cudagraph", "cudnn_benchmark", "channels_last"):
            if t in usable and gains(t) and self.valid(recipe | {t}, ctx):
                recipe = recipe | {t}
        return recipe if len(recipe) >= 2 else None

    def _children(self, a: frozenset, b: frozenset | None, usable: list[str], ctx: Context):
        out = [(a | {t}, "extend") for t in usable if t not in a]
        if b is not None:
            merged = set(a | b)
            modes = [t for t in merged if t.startswith("compile:")]
            if len(modes) > 1:  # conflicting compile modes: keep the faster exemplar's
                merged -= set(m for m in modes if m not in a)
            if "cudagraph" in merged and any(t.startswith("compile:") and t not in GRAPH_SAFE_MODES for t in merged):
                merged -= {"cudagraph"} if "cudagraph" not in a else {t for t in merged if t.startswith("compile:")}
            out.append((frozenset(merged), "combine"))
        mode = next((t for t in a if t.startswith("compile:")), None)
        if mode:
            out += [((a - {mode}) | {m}, "swap") for m in usable if m.startswith("compile:") and m != mode]
            out.append(((a - {mode}) | {"cudagraph"}, "swap"))
        if len(a) > 1:
            out += [(a - {t}, "ablate") for t in a]
        return [(c, op) for c, op in out if c and all(t in usable for t in c)]

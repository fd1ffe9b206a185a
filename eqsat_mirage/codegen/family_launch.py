"""The host-side lines a shape family's launcher adds to a generated module.

A shape family's module (``triton_source(..., family=...)``) serves every length L of
its named size: ``family_head`` writes its constants (``SIZE``, ``GRANULE``, ``LENGTHS``,
``HINT``, ``PADDED``, ``SHORT``), ``family_run`` the lines of ``run`` that read L from
the inputs, check it, compute the padded size ``lp``, zero-pad the inputs a torch op
reads and re-read the strides that change with L, and ``cut_to_length`` narrows an
output back to L. The layout they read (granule, range, short inputs) is
``family_layout.py``'s ``FamilyLayout``; the rest of the module is ``source.py``; one
launcher for every padded size is the family stage's (``family/launcher.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from .family_layout import FamilyLayout
from .host import unpack
from .kernel import wrap
from .tiles import named

__all__ = ["cut_to_length", "family_head", "family_run"]


def family_head(fam: FamilyLayout, dyn: Mapping[str, tuple[int, ...]]) -> list[str]:
    """A family module's constants: its size, granule, range, hint and unpadded inputs."""
    lines = [f"SIZE = {fam.name!r}  # a shape family: axes named {named(fam.name)} in INPUTS and "
             "OUTPUTS have any length",
             f"GRANULE = {fam.granule}  # the kernels run at the padded size lp: L rounded up "
             "to a multiple",
             f"LENGTHS = ({fam.low}, {fam.high})  # L's range (min, max; None: no maximum)",
             f"HINT = {fam.hint}  # the size the plan was priced at",
             f"PADDED = {fam.padded}  # " + ("the one padded size this module serves"
                                            if fam.padded else "None: every padded size")]
    short = {n: axes for n, axes in dyn.items() if n in fam.short}
    return lines + [f"SHORT = {short!r}  # read as they are, loads masked at L",
                    "# (the other inputs with an axis of size L are zero-padded to lp first)"]


def family_run(fam: FamilyLayout, dyn: Mapping[str, tuple[int, ...]], var: Mapping[str, str],
                pointed: set[str], strides: Mapping[str, list[str]],
                ranks: Mapping[str, int]) -> list[str]:
    """A family launcher's lines after ``_bind``: L read from the inputs (they must agree
    and L lie in range), the padded size ``lp``, the zero-padding of inputs a torch op
    reads, and the per-call strides of every input with a dynamic axis."""
    seen = [f"{var[n]}.shape[{a}]" for n in dyn for a in dyn[n]]
    lines = [f"    seq_len = {seen[0]}  # L: every axis named {named(fam.name)} has this length"]
    if len(seen) > 1:
        cond = wrap([f"{s} != seq_len or" for s in seen[1:]], "", "", 88)
        cond[-1] = cond[-1][:-3]
        if len(cond) == 1:
            lines.append(f"    if {cond[0]}:")
        else:  # one condition per line, in brackets
            lines += ["    if ("] + [f"            {c}" for c in cond] + ["    ):"]
        lines.append('        raise ValueError(f"the inputs disagree on the size {SIZE}: "')
        shown = wrap([f"{s} = {{{s}}}," for s in seen], "", "", 64)
        shown[-1] = shown[-1].rstrip(",")
        lines += [f'                         f"{line} "' for line in shown[:-1]]
        lines.append(f'                         f"{shown[-1]}")')
    lines += [f"    if not {fam.low} <= seq_len" + (f" <= {fam.high}:" if fam.high is not None
                                                   else ":"),
              f'        raise ValueError(f"size {{SIZE}} = {{seq_len}} ({seen[0]}) is outside '
              f'the range this module serves: {fam.low}..{fam.high or ""}")']
    lines.append("    lp = -(-seq_len // GRANULE) * GRANULE  # the padded size the kernels run at")
    if fam.padded:
        lines += [f"    if lp != {fam.padded}:",
                  f'        raise ValueError(f"this module serves padded size {fam.padded} only '
                  f'(L in ({fam.padded - fam.granule}, {fam.padded}]), got L = {{seq_len}}")']
    padded = [n for n in dyn if n not in fam.short]
    if padded:
        lines.append("    if lp != seq_len:  # inputs a torch op reads: zero-padded to lp")
        for n in padded:
            pad = []
            for a in reversed(range(ranks[n])):  # F.pad's pairs start at the last axis
                pad += ["0", "lp - seq_len" if a in dyn[n] else "0"]
            while pad[-2:] == ["0", "0"]:
                pad = pad[:-2]
            lines.append(f"        {var[n]} = torch.nn.functional.pad({var[n]}, "
                         f"({', '.join(pad)}))")
    for n in dyn:  # strides change with L (and with the padding)
        if n in pointed:
            lines += unpack(strides[n], f"{var[n]}.stride()")
    return lines


def cut_to_length(value: str, axes) -> str:
    """``value`` narrowed to ``seq_len`` along ``axes`` (a family's output)."""
    for a in sorted(axes):
        value += f".narrow({a}, 0, seq_len)"
    return value

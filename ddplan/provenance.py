"""What produced an output: the ddplan version and a short hash of each spec, calibration and dataset it read.

A golden file in a user's CI then says whether a changed number comes from a new ddplan, a changed
hardware or model spec, or a new calibration. The hash is sha256 of the spec as ddplan validated it
(canonical JSON: sorted keys, fields at their default left out), first 12 hex digits: a spec edited in a
way that changes nothing ddplan reads (comments, key order, a default written out) keeps its hash, and so
does every spec when a new ddplan adds a schema field with a default (the version says that change).
"""

from __future__ import annotations

import hashlib
import json

from ddplan import __version__


def spec_hash(spec) -> str:
    """12 hex digits of sha256 over the validated spec's canonical JSON (defaults left out)."""
    text = json.dumps(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def provenance(**specs) -> dict:
    """{"ddplan": version, role: {"name", "sha256"}} for each spec given (None ones left out); a value may be
    a (name, spec) pair where the spec has no name of its own (a calibration, a dataset)."""
    out: dict = {"ddplan": __version__}
    for role, spec in specs.items():
        if spec is None:
            continue
        name, spec = spec if isinstance(spec, tuple) else (getattr(spec, "name", None) or role, spec)
        out[role] = {"name": name, "sha256": spec_hash(spec)}
    return out


def line(prov: dict) -> str:
    """One line for a csv header comment, a markdown or table footer and a plot caption."""
    parts = [f"ddplan {prov['ddplan']}"]
    parts += [f"{role} {v['name']} ({v['sha256']})" for role, v in prov.items() if role != "ddplan"]
    return "; ".join(parts)

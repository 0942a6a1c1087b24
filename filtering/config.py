"""Filter-job config: which filters run, their parameters and thresholds. YAML (or JSON) file:

    filters:
      - name: paraphrase_score
        model: runs/enc-wt                 # filter parameters next to name
        thresholds:
          paraphrase_score: {min: 0.4, max: 1.0}
      - name: ngram_overlap
        n: [1, 2, 3]
        thresholds:
          trigram_overlap: {max: 0.7}
    fit_sample: 2000                       # rows used to fit the LM and the classifiers

Everything is checked when the file is loaded, before any data is read: an unknown filter, an
unknown parameter, a threshold for a score the filter does not produce, a non-numeric or
inverted bound, or a bound against the score's direction fails with a message naming it.
Presets live in filtering/presets/<name>.yaml (``--preset paranmt``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import yaml

from common.steps import Rule
from filtering.filters import FILTERS, Filter

PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")


MAX_CONFIG_BYTES = 1 << 20      # a config is a few hundred bytes; a bigger file is a mistake


def presets() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(PRESET_DIR) if f.endswith(".yaml"))


@dataclass
class FilterConfig:
    filters: list[Filter]
    rules: list[Rule]
    fit_sample: int = 2000
    source: str = ""
    raw: dict = field(default_factory=dict)

    @property
    def score_columns(self) -> list[str]:
        return [name for f in self.filters for name in f.scores]


def parse_config(raw: dict, source: str = "<config>", overrides: dict | None = None) -> FilterConfig:
    """Validate RAW (the parsed YAML). OVERRIDES {filter name: {param: value}} fill parameters such as
    model paths from the command line."""
    if not isinstance(raw, dict) or not isinstance(raw.get("filters"), list) or not raw["filters"]:
        raise ValueError(f"{source}: needs a non-empty 'filters' list")
    unknown_top = set(raw) - {"filters", "fit_sample", "description"}
    if unknown_top:
        raise ValueError(f"{source}: unknown key(s) {', '.join(sorted(unknown_top))}")
    filters, rules, seen = [], [], set()
    for i, entry in enumerate(raw["filters"]):
        if not isinstance(entry, dict) or "name" not in entry:
            raise ValueError(f"{source}: filters[{i}] needs a name")
        name = entry["name"]
        if name not in FILTERS:
            raise ValueError(f"{source}: unknown filter {name!r}; available: {', '.join(sorted(FILTERS))}")
        if name in seen:
            raise ValueError(f"{source}: filter {name!r} listed twice")
        seen.add(name)
        params = {k: v for k, v in entry.items() if k not in ("name", "thresholds")}
        params.update((overrides or {}).get(name, {}))
        flt = FILTERS[name](**params)
        thresholds = entry.get("thresholds") or {}
        if not isinstance(thresholds, dict):
            raise ValueError(f"{source}: {name}.thresholds must be a mapping of score -> {{min, max}}")
        for score, bounds in thresholds.items():
            where = f"{source}: {name}.thresholds.{score}"
            if score not in flt.scores:
                raise ValueError(f"{where}: filter {name!r} has no score {score!r}; its scores: "
                                 f"{', '.join(flt.scores)}")
            if not isinstance(bounds, dict) or not bounds or set(bounds) - {"min", "max"}:
                raise ValueError(f"{where}: give min and/or max")
            rules.append(Rule(score, flt.scores[score], bounds.get("min"), bounds.get("max")).check(where))
        filters.append(flt)
    fit_sample = raw.get("fit_sample", 2000)
    if not isinstance(fit_sample, int) or isinstance(fit_sample, bool) or fit_sample < 10:
        raise ValueError(f"{source}: fit_sample must be an integer >= 10")
    return FilterConfig(filters, rules, fit_sample, source, raw)


def load_config(path_or_preset: str, overrides: dict | None = None) -> FilterConfig:
    """The config in the file PATH_OR_PRESET (a local path or a URL) or the preset of that name."""
    from common import storage

    path = path_or_preset
    if not storage.isfile(path):
        path = os.path.join(PRESET_DIR, f"{path_or_preset}.yaml")
        if not os.path.exists(path):
            raise ValueError(f"no config file or preset {path_or_preset!r}; presets: {', '.join(presets())}")
    data = storage.read_bytes(path)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: {len(data):,} bytes is not a filter config (at most {MAX_CONFIG_BYTES:,})")
    try:
        text = data.decode("utf-8")
        raw = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid YAML/JSON: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError(f"{path}: not a filter config (nested too deeply to parse)") from None
    return parse_config(raw, path, overrides)

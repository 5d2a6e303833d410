"""RoPE scaling, the variants checkpoints ask for in config.json's `rope_scaling`: Llama 3.1's
and YaRN's inverse frequencies, and YaRN's attention factor. minispec/core/model.py's
`rope_inv_freq` applies them; a reader of the lesson can skip this file.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .config import ModelConfig
from .errors import MinispecError

MAX_ATTENTION_FACTOR = 1000.0  # YaRN's scale on cos/sin; past it the scores can overflow float32


def llama3_inv_freq(inv: np.ndarray, rs: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's scaling: long wavelengths slowed down by `factor`, short ones kept, the band
    between blended. inv [E/2] -> [E/2]."""
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * inv / factor + smooth * inv
    return np.where(wavelen < old / hi, inv, np.where(wavelen > old / lo, inv / factor, blended))


def yarn_inv_freq(inv: np.ndarray, rs: dict[str, Any], theta: float) -> np.ndarray:
    """YaRN (Peng et al. 2023, section 3.2, as transformers computes it): dimensions that turn
    fewer than beta_slow times over the original context are slowed down by `factor`, those that
    turn more than beta_fast times are kept, the ones between ramp linearly. inv [E/2] -> [E/2]."""
    e, old = 2 * len(inv), rs["original_max_position_embeddings"]

    def dim_turning(turns: float) -> float:  # the dimension d whose wavelength fits `turns` times
        return e * (math.log(old) - math.log(turns) - math.log(2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_turning(rs.get("beta_fast") or 32), dim_turning(rs.get("beta_slow") or 1)
    if rs.get("truncate", True):
        lo, hi = float(math.floor(lo)), float(math.ceil(hi))
    lo, hi = max(lo, 0.0), min(hi, e - 1.0)
    ramp = np.clip((np.arange(e // 2) - lo) / ((hi - lo) or 0.001), 0.0, 1.0)  # [E/2], 0 -> 1
    return inv / rs["factor"] * ramp + inv * (1 - ramp)


def rope_attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by: 1, but for YaRN sqrt of its attention temperature
    (q and k both carry it), 0.1 ln(factor) + 1 unless the config gives it."""
    rs = config.rope_scaling
    if rs is None or rs["rope_type"] != "yarn":
        return 1.0

    def mscale(m: float) -> float:
        return 1.0 if rs["factor"] <= 1 else 0.1 * m * math.log(rs["factor"]) + 1.0

    if "attention_factor" in rs:
        f = rs["attention_factor"]
    elif rs.get("mscale") and rs.get("mscale_all_dim"):  # DeepSeek's spelling
        f = mscale(rs["mscale"]) / mscale(rs["mscale_all_dim"])
    else:
        f = mscale(1.0)
    if not 0 < f <= MAX_ATTENTION_FACTOR:  # every score grows by f^2: float32 overflows
        raise MinispecError(f"ModelConfig.rope_scaling {rs}: YaRN's attention factor is {f:.3g};"
                            f" expected at most {MAX_ATTENTION_FACTOR:g} (published ones are 1-2)")
    return f

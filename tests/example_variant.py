"""A fifth attention variant, as a researcher would add one (docs/adding-a-variant.md): efficient
attention with a learned temperature per head,

    H_i = softmax(exp(t_i) * X W^Q_i X_i^T / sqrt(d_k)) X_i,

one class and one registry line. conftest.py imports it, so every test over the registry runs it
beside the paper's four; its equation, the oracle, is in test_model.py (SCORES)."""
import torch
import torch.nn as nn

from model import ATTENTION_CLASSES, EfficientAttention


class TemperatureAttention(EfficientAttention):
    def __init__(self, config):
        super().__init__(config)
        self.log_temperature = nn.Parameter(torch.zeros(config.n_head))  # exp(0) = 1: efficient

    def attend(self, q, k, v, cache):
        # scaling the queries scales the scores, and keeps the fused attention kernels
        scale = self.log_temperature.exp().to(q.dtype)[:, None, None]
        return super().attend(q * scale, k, v, cache)


ATTENTION_CLASSES["temperature"] = TemperatureAttention

"""The real Huginn-0125 checkpoint's config (its shape fields), for the loading tests."""


# Huginn-0125's config.json, the fields that set shapes.
HUGINN_0125 = {
    "architectures": ["RavenForCausalLM"], "model_type": "huginn_raven", "n_embd": 5280, "n_heads": 55,
    "n_layers": 8, "block_size": 4096, "vocab_size": 65536, "padding_multiple": 4096, "tie_embeddings": True,
    "intermediate_size": 17920, "bias": False, "norm_eps": 1e-6, "n_layers_in_recurrent_block": 4,
    "mean_recurrence": 32, "mean_backprop_depth": 8, "n_layers_in_prelude": 2, "n_layers_in_coda": 2,
    "qk_bias": True, "rope_base": 50000, "state_init": "like-init", "injection_type": "linear",
    "auto_map": {"AutoConfig": "raven_config_minimal.RavenConfig",
                 "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM"},
}


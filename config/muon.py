# Muon (torch.optim.Muon: K. Jordan et al., "Muon: An optimizer for hidden layers in neural
# networks", 2024) for the weights of the blocks' linear layers, each matrix of a stacked weight
# (Q, K, V; a gated MLP's u and v) on its own; AdamW for embeddings, head, gains, scaling vectors
# and a rule's own parameters. Stack it after a rule's config and before config/cpu.py, which
# then takes the rates tuned for Muon:
#   python train.py config/shakespeare_add.py config/muon.py config/cpu.py
if out_dir.endswith('-cpu'):  # noqa: F821  (set by the configs before this one)
    raise ValueError("stack config/muon.py before config/cpu.py: cpu.py, stacked last, sets the rates tuned "
                     "for the optimizer it finds")
optimizer = 'muon'
muon_lr = 0.02
muon_weight_decay = 0.0
out_dir = out_dir + '-muon'  # noqa: F821

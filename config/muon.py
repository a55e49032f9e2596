# Muon (torch.optim.Muon: K. Jordan et al., "Muon: An optimizer for hidden layers in neural
# networks", 2024) for the blocks' matrices, AdamW for embeddings, head, gains and scaling vectors.
# Stack it after any config, e.g. python train.py config/shakespeare_add.py config/cpu.py config/muon.py
optimizer = 'muon'
muon_lr = 0.02
out_dir = out_dir + '-muon'  # noqa: F821  (set by the config before this one)

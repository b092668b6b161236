import torch

torch.set_num_threads(1)  # 2-core CI machines: several ranks per test share them

"""The model families' PyTorch side, one folder each: a family's model, config section, Hugging Face
import, graph builders, gate and calibration hooks, fitting and benchmark driver. Their torch-free
side (record, specs, runtime class, served task, ES module) is ``edgeattn.runtime.families``."""

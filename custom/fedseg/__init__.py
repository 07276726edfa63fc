"""fedseg: federated medical image segmentation on NVIDIA FLARE and MONAI.

Layout (a map of the architecture):
    data/        datalists, built-in synthetic multi-site generators, real-data importers, transforms
    networks/    the U-Net with named intermediate features
    engine/      ONE local train/evaluate engine (ignite, via MONAI's SupervisedTrainer)
    objectives/  client-side method plug-ins: loss terms and declared statistics
    strategies/  server-side plug-ins: how client results become the next model(s)
    uncertainty/, metrics/  shared maths, each tested against an independent reference
    fl/          the NVFlare controller (server) and the client loop (site)
    recipes/     one NVFlare recipe per method; `fedseg export` writes jobs/<method>
    methods.py   the method table: each method's recipe, objective, strategy and kind; every method list
    plots/       report figures
"""

__version__ = "0.1.0"

"""Names shared by the server controller and the site client loop."""

TRAIN_TASK = "train"
EVALUATE_TASK = "evaluate"
#: FLModel.meta key holding the job's settings for the site (method, objective, train_config, round)
META_KEY = "fedseg"
#: what a site may always send besides the objective's declared statistics
BASE_STATISTICS = ("n_samples",)

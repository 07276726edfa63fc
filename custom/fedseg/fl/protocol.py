"""Names shared by the server controller and the site client loop."""

TRAIN_TASK = "train"
EVALUATE_TASK = "evaluate"
#: after training, a site sends its personalised model (NVFlare's cross-site evaluation convention): Ditto's
#: personal model, FedBN's / FedRep's model with its local layers (``ServerStrategy.personalized_at_sites``)
SUBMIT_MODEL_TASK = "submit_model"
#: FLModel.meta key holding the job's settings for the site (method, objective, train_config, round)
META_KEY = "fedseg"
#: a segmentation site's spatial settings, sent with its trained weights: ``[1.0 if patch mode else 0.0, rescale]``.
#: A job leaves them to each site's datalist by default; the server records them with the saved models so that
#: ``fedseg infer`` runs a model the way it was trained (two numbers about the data's declared geometry, no data)
SPATIAL_KEY = "spatial"
#: the spatial modes as the numbers a site sends under :data:`SPATIAL_KEY` (metadata values are numbers)
SPATIAL_MODE_CODES = {"resize": 0.0, "patch": 1.0, "slices": 2.0}
#: what a site may always send besides the objective's declared statistics: its number of training images and
#: the round its result is for (NVFlare stamps the task's round on every result itself, so a site that sends
#: a result it computed for an earlier round is only seen through this echo; ``fedseg.fl.screening``), and
#: :data:`SPATIAL_KEY`
BASE_STATISTICS = ("n_samples", "round", SPATIAL_KEY)

#: task meta key asking a site to score the model it receives on its validation split before it trains (train task)
#: or tests it (evaluate task): the round's global model is then validated with the next round's train task instead
#: of by a task of its own (``fedseg.fl.model_selection``)
VALIDATE_RECEIVED_KEY = "validate_received"
#: prefix of that score in the result's metrics: ``received_val_dice`` (or ``received_val_accuracy``)
RECEIVED_PREFIX = "received_"

#: key prefix of the extra models a task carries besides the main weights (FedEFM's overseas experts
#: and neighbours): ``"__model__/<name>/<parameter>"``
EXTRA_MODEL_PREFIX = "__model__/"


def pack_models(models, main=None):
    """Flatten named state dicts (and optionally the main weights, unprefixed) into one params dict.

    Args:
        models: ``{name: {parameter: tensor}}``; names must not contain ``/``.
        main: the main model's ``{parameter: tensor}`` or ``None``.
    Returns:
        ``{parameter or "__model__/<name>/<parameter>": tensor}``.
    """
    flat = dict(main or {})
    for name, state in models.items():
        if not name or "/" in name:
            raise ValueError(f"model name {name!r} must be non-empty and contain no '/'")
        for key, value in state.items():
            flat[f"{EXTRA_MODEL_PREFIX}{name}/{key}"] = value
    return flat


def unpack_models(flat):
    """Inverse of :func:`pack_models`: ``(main {parameter: tensor}, {name: {parameter: tensor}})``."""
    main, models = {}, {}
    for key, value in flat.items():
        if key.startswith(EXTRA_MODEL_PREFIX):
            name, _, parameter = key[len(EXTRA_MODEL_PREFIX):].partition("/")
            if not name or not parameter:
                raise ValueError(f"malformed packed model key {key!r}")
            models.setdefault(name, {})[parameter] = value
        else:
            main[key] = value
    return main, models

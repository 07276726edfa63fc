"""Homomorphic aggregation (CKKS, TenSEAL): the server combines the sites' models without reading one.

Keys are provisioned as NVFlare's ``HEBuilder`` does (``deploy/project.yml``): one CKKS context
(poly_modulus_degree 8192, coefficient moduli [60, 40, 40] bits, scale 2^40, symmetric encryption) whose secret key
goes into every site's startup kit (``client_context.tenseal``) and whose evaluation part alone (relinearisation keys,
no secret key) goes into the server's (``server_context.tenseal``). A server whose context holds a secret key, or a
site whose context holds none, is refused before the first task (:func:`check_server_context`,
:func:`check_site_context`).

What a site encrypts: every floating-point entry of the model it sends (or those ``encrypt_layers`` names, as
NVFlare's ``HEModelEncryptor``: a list of names or a regular expression), flattened and cut into CKKS vectors of at
most N/2 = 4096 slots, one ciphertext each. Integer entries (batch norm's ``num_batches_tracked``) and the declared
statistics (sample counts, FedEvi's uncertainties) stay in the clear: the server needs them to choose its weights,
and they describe the site's data as the declared statistics already do in every method.

What the server computes: ``sum_k w_k E(x_k) = E(sum_k w_k x_k)``, plaintext weights times ciphertexts, then sums of
ciphertexts (:meth:`Ciphertext.weighted_sum`). That is one multiplicative level, exactly what the provisioned context
has, and it is every server step of the form "weighted sum of site models" (FedAvg, FedProx, FedEvi, FVAC, PathFL
without SSA, FedBN, FedRep, Ditto's global model, MOON). The weights themselves are plaintext: they come from sample
counts and declared statistics.

Precision: CKKS is approximate. For a convex combination of K models with entries in [-M, M], every decrypted entry
lies within :data:`CKKS_ABS_TOL` * max(1, M) of the float64 weighted sum (``tests/test_homomorphic.py`` checks it
against NumPy; ``docs/results/cost.md`` records one aggregation of the default U-Net at 1.6e-7). That is below
float16's resolution and far below a training step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

#: NVFlare's names of the provisioned contexts (``nvflare.lighter.constants.ProvFileName``)
SERVER_CONTEXT = "server_context.tenseal"
SITE_CONTEXT = "client_context.tenseal"
#: the provisioned CKKS parameters (NVFlare's HEBuilder defaults): slots per ciphertext = 8192 / 2
SLOTS = 4096
#: |decrypt(sum_k w_k E(x_k)) - sum_k w_k x_k| <= CKKS_ABS_TOL * max(1, max |x|) for convex weights w
CKKS_ABS_TOL = 1e-5
#: key of a checkpointed ciphertext: ``{CIPHERTEXT_KEY: [bytes per chunk], "shape": [...]}``
CIPHERTEXT_KEY = "ckks"

LayerSpec = Union[None, str, Sequence[str]]


class HEError(ValueError):
    """Homomorphic aggregation cannot run as configured (keys, method, options); the message is one line."""


def _tenseal():
    try:
        import tenseal
    except ImportError as e:  # an extra: pip install -e ".[he]"
        raise HEError("homomorphic aggregation needs TenSEAL: pip install -e \".[he]\" (or pip install tenseal)") from e
    return tenseal


# ------------------------------------------------------------------------------------------------ keys
def provision_contexts(folder: Path) -> Tuple[Path, Path]:
    """Write a fresh key pair into ``folder`` exactly as NVFlare's ``HEBuilder`` provisions one (its own code makes
    the context): ``(server context without secret key, site context with it)``. For the simulator, whose
    sites and server share one machine; POC and production provision with ``HEBuilder`` in the project file."""
    from nvflare.lighter.impl.he import HEBuilder

    builder = HEBuilder()
    builder.initialize(None, None)  # makes the context; the project is not read
    folder.mkdir(parents=True, exist_ok=True)
    server, site = folder / SERVER_CONTEXT, folder / SITE_CONTEXT
    server.write_bytes(builder.get_serialized_context(is_client=False))
    site.write_bytes(builder.get_serialized_context(is_client=True))
    return server, site


def simulator_he_options(folder: Path, encrypt_layers: LayerSpec = None) -> Dict[str, Any]:
    """The recipe options of homomorphic aggregation in NVFlare's simulator: a key pair written by
    :func:`provision_contexts` into ``folder/he_keys`` (a folder that should go with the run), the server given the
    public context and every site the secret one. The simulator's participants share one machine, so this shows the
    computation and what the server keeps, not the separation of keys, which POC and production give
    (``deploy/README.md``)."""
    server, site = provision_contexts(Path(folder) / "he_keys")
    return {"he": True, "he_server_context": str(server), "he_site_context": str(site), "he_encrypt_layers": encrypt_layers}


def load_context(name: str, fl_ctx=None):
    """The TenSEAL context ``name``: an absolute path is read as it is (keys written for the simulator), a name is
    looked up in the participant's startup kit by NVFlare (``load_tenseal_context_from_workspace``: signed content
    in secure mode).

    Raises:
        HEError: the file is missing or not a TenSEAL context.
    """
    ts = _tenseal()
    path = Path(name)
    try:
        if path.is_absolute():
            return ts.context_from(path.read_bytes())
        if fl_ctx is None:
            raise HEError(f"HE context {name!r}: a name is looked up in the startup kit, which needs NVFlare's context")
        from nvflare.app_opt.he.homomorphic_encrypt import load_tenseal_context_from_workspace

        return load_tenseal_context_from_workspace(name, fl_ctx)
    except HEError:
        raise
    except Exception as e:  # noqa: BLE001 - missing file, bad signature, not a context: one line
        raise HEError(f"HE context {name!r} cannot be loaded ({type(e).__name__}: {e}); provision the keys with "
                      "NVFlare's HEBuilder (deploy/README.md)") from e


def check_server_context(context) -> None:
    """Refuse a server context that could decrypt: the server must hold the evaluation keys only."""
    if context.is_private():
        raise HEError("the server's HE context holds a secret key: it could decrypt every site's model; provision it "
                      "with NVFlare's HEBuilder, which gives the server the public context only")


def check_site_context(context, site: str) -> None:
    """Refuse a site context without the secret key (the site could not decrypt the global model)."""
    if not context.is_private():
        raise HEError(f"{site}: its HE context holds no secret key, so it cannot decrypt the global model; it needs "
                      "the client_context.tenseal NVFlare's HEBuilder wrote into its startup kit")


# ------------------------------------------------------------------------------------------------ ciphertexts
@dataclass
class Ciphertext:
    """One model entry of shape ``shape``, encrypted: its flattened values in CKKS vectors of at most
    :data:`SLOTS` values each (``chunks``, TenSEAL ``CKKSVector``)."""

    chunks: List[Any]
    shape: Tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @classmethod
    def weighted_sum(cls, values: Sequence["Ciphertext"], weights: Sequence[float]) -> "Ciphertext":
        """``sum_k weights[k] * values[k]`` in the encrypted domain (plaintext weights; one multiplicative level)."""
        shape = values[0].shape
        if any(v.shape != shape or len(v.chunks) != len(values[0].chunks) for v in values):
            raise ValueError(f"ciphertexts of different shapes: {[v.shape for v in values]}")
        chunks = []
        for i in range(len(values[0].chunks)):
            acc = values[0].chunks[i] * float(weights[0])
            for value, w in zip(values[1:], weights[1:]):
                acc = acc + value.chunks[i] * float(w)
            chunks.append(acc)
        return cls(chunks, shape)

    def serialize(self) -> List[bytes]:
        """The wire form: one ``bytes`` per chunk (ciphertext only: the context, and any key, stays behind)."""
        return [chunk.serialize() for chunk in self.chunks]

    @classmethod
    def from_bytes(cls, chunks: Sequence[bytes], shape: Sequence[int], context) -> "Ciphertext":
        ts = _tenseal()
        return cls([ts.ckks_vector_from(context, bytes(c)) for c in chunks], tuple(int(s) for s in shape))


def is_wire_ciphertext(value: Any) -> bool:
    """Whether ``value`` is an encrypted entry as it travels: a non-empty list of ``bytes``."""
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(c, (bytes, bytearray)) for c in value)


def encrypt_tensor(value: torch.Tensor, context) -> List[bytes]:
    """A tensor's values as serialised CKKS vectors of at most :data:`SLOTS` values (float64 before encoding)."""
    ts = _tenseal()
    flat = value.detach().cpu().double().reshape(-1).numpy()
    return [ts.ckks_vector(context, flat[i:i + SLOTS].tolist()).serialize() for i in range(0, max(flat.size, 1), SLOTS)]


def decrypt_tensor(chunks: Sequence[bytes], context, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`encrypt_tensor` with the secret key in ``context``; ValueError if the size is not ``shape``'s."""
    ts = _tenseal()
    values: List[float] = []
    for chunk in chunks:
        values.extend(ts.ckks_vector_from(context, bytes(chunk)).decrypt())
    numel = int(np.prod(shape)) if len(shape) else 1
    if len(values) != numel:
        raise ValueError(f"an encrypted entry holds {len(values)} values, its model entry {tuple(shape)} has {numel}")
    return torch.tensor(values, dtype=torch.float64).reshape(tuple(shape)).to(dtype)


def layer_selector(encrypt_layers: LayerSpec):
    """``name -> bool`` for NVFlare's ``encrypt_layers`` forms: None = every entry, a list of names, or a regular
    expression matched with ``re.search``."""
    if encrypt_layers is None:
        return lambda name: True
    if isinstance(encrypt_layers, str):
        pattern = re.compile(encrypt_layers)
        return lambda name: bool(pattern.search(name))
    names = set(encrypt_layers)
    return lambda name: name in names


# ------------------------------------------------------------------------------------------------ the site
class SiteEncryption:
    """A site's half: decrypt what it receives, encrypt what it sends.

    Args:
        context: the site's TenSEAL context (with the secret key).
        site: the site's name (in messages).
        encrypt_layers: which floating-point entries to encrypt (:func:`layer_selector`).
    """

    def __init__(self, context, site: str, encrypt_layers: LayerSpec = None):
        check_site_context(context, site)
        self.context, self.site = context, site
        self.encrypt_layers = encrypt_layers
        self._selected = layer_selector(encrypt_layers)

    def encrypt(self, params: Mapping[str, Any]) -> Dict[str, Any]:
        """``params`` with every selected floating-point tensor replaced by its ciphertexts (``List[bytes]``).

        Raises:
            HEError: a selected entry holds NaN or Inf (the server cannot see it, so the site checks), or
                ``encrypt_layers`` selects no entry.
        """
        out: Dict[str, Any] = {}
        for key, value in params.items():
            if isinstance(value, torch.Tensor) and torch.is_floating_point(value) and self._selected(key):
                if not bool(torch.isfinite(value).all()):
                    raise HEError(f"{self.site}: '{key}' contains NaN or Inf; nothing is sent")
                out[key] = encrypt_tensor(value, self.context)
            else:
                out[key] = value
        if params and not any(is_wire_ciphertext(v) for v in out.values()):
            raise HEError(f"{self.site}: encrypt_layers {self.encrypt_layers!r} selects no floating-point entry")
        return out

    def decrypt(self, params: Mapping[str, Any], reference: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
        """``params`` with every encrypted entry decrypted to the shape and dtype of ``reference[key]`` (the site's
        own model entry of that name; ValueError for a name it does not have)."""
        out: Dict[str, Any] = {}
        for key, value in params.items():
            if is_wire_ciphertext(value):
                if key not in reference:
                    raise ValueError(f"{self.site}: received an encrypted entry {key!r} its model does not have")
                out[key] = decrypt_tensor(value, self.context, tuple(reference[key].shape), reference[key].dtype)
            else:
                out[key] = value
        return out


# ------------------------------------------------------------------------------------------------ the server
class ServerAggregation:
    """The server's half: read the sites' encrypted entries into :class:`Ciphertext` (which
    ``fedseg.strategies.aggregation.weighted_average`` sums), send and store them in their wire form.

    Args:
        context: the server's TenSEAL context (no secret key; refused otherwise).
        encrypt_layers: what the sites encrypt (sent to them with every task).
    """

    def __init__(self, context, encrypt_layers: LayerSpec = None):
        check_server_context(context)
        self.context = context
        self.encrypt_layers = encrypt_layers

    def read(self, site: str, params: Mapping[str, Any], reference: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
        """A site's returned model: encrypted entries as :class:`Ciphertext` of ``reference``'s shapes, the others as
        tensors checked like any update (names, shapes, finite values).

        Raises:
            fedseg.fl.validation.InvalidUpdateError: names differ from ``reference``, a ciphertext does not parse or
                holds another number of values than its entry.
        """
        from fedseg.fl.validation import InvalidUpdateError, validate_params

        if not params:
            raise InvalidUpdateError(f"{site}: empty model update")
        encrypted = {k: v for k, v in params.items() if is_wire_ciphertext(v)}
        missing, extra = sorted(set(reference) - set(params)), sorted(set(params) - set(reference))
        if missing or extra:
            raise InvalidUpdateError(f"{site}: parameter names differ from the global model: missing={missing[:5]} "
                                     f"unexpected={extra[:5]}")
        out: Dict[str, Any] = {}
        for key, chunks in encrypted.items():
            shape = tuple(reference[key].shape)
            try:
                value = Ciphertext.from_bytes(chunks, shape, self.context)
                size = sum(c.size() for c in value.chunks)
            except Exception as e:  # noqa: BLE001 - not a ciphertext of this context
                raise InvalidUpdateError(f"{site}: '{key}' is not a ciphertext of this federation's context "
                                         f"({type(e).__name__})") from e
            if size != value.numel:
                raise InvalidUpdateError(f"{site}: '{key}' holds {size} encrypted values, expected shape {shape}")
            out[key] = value
        clear = {k: v for k, v in params.items() if k not in encrypted}
        if clear:
            out.update(validate_params(site, clear, {k: reference[k] for k in clear}))
        return out

    @staticmethod
    def to_wire(params: Mapping[str, Any]) -> Dict[str, Any]:
        """``params`` as sent: every :class:`Ciphertext` as its serialised chunks, tensors as they are."""
        return {k: (v.serialize() if isinstance(v, Ciphertext) else v) for k, v in params.items()}

    def encode(self, value: Any) -> Any:
        """``value`` (a strategy state, a model) with every :class:`Ciphertext` as ``{"ckks": [bytes], "shape"}``, the
        form ``torch.load(weights_only=True)`` reads back (round checkpoints, the stored global model)."""
        if isinstance(value, Ciphertext):
            return {CIPHERTEXT_KEY: value.serialize(), "shape": list(value.shape)}
        if isinstance(value, dict):
            return {k: self.encode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.encode(v) for v in value)
        return value

    def decode(self, value: Any) -> Any:
        """Inverse of :meth:`encode`."""
        if isinstance(value, dict):
            if set(value) == {CIPHERTEXT_KEY, "shape"}:
                return Ciphertext.from_bytes(value[CIPHERTEXT_KEY], value["shape"], self.context)
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        return value


def he_task_meta(encrypt_layers: LayerSpec) -> Dict[str, Any]:
    """What every task tells the sites under HE: encrypt what you send (these entries), decrypt what you receive."""
    return {"encrypt_layers": encrypt_layers if encrypt_layers is None or isinstance(encrypt_layers, str)
            else list(encrypt_layers)}


def refusal(strategy, server_step: Optional[Any], payload_dtype: torch.dtype) -> Optional[str]:
    """Why this job cannot aggregate under HE (one line), or None when it can: the strategy's own reason
    (``ServerStrategy.he_refusal``), a server optimiser, or a wire dtype other than float32."""
    reason = strategy.he_refusal()
    if reason:
        return f"{strategy.name}: {reason}"
    if server_step is not None:
        return ("a server optimiser (server_optimizer) steps with the model's update and keeps moments of it "
                "at the server, which needs the model in the clear; use server_optimizer=none")
    if payload_dtype != torch.float32:
        return "payload_dtype must be float32: CKKS encodes the weights itself"
    return None

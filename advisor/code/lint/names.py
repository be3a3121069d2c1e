"""Names the rules recognise. Kept here, in one place, so a new spelling is a one-line change."""

from __future__ import annotations

import re

from advisor.knobs import written_at
from advisor.knobs.knob import IN_LOADER

NO_GRAD_CONTEXTS = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.inference_mode",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}
SET_GRAD_ENABLED = {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}

# torch.nn.functional losses, for `F.cross_entropy(...)` style criteria.
FUNCTIONAL_LOSSES = {
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "ctc_loss",
    "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss", "margin_ranking_loss",
    "hinge_embedding_loss", "multi_margin_loss", "multilabel_margin_loss", "soft_margin_loss",
    "multilabel_soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
}
# Calls that turn a tensor into a Python number or cut it from the graph.
GRAPH_FREE_METHODS = {"item", "detach", "tolist", "numpy", "detach_"}
GRAPH_FREE_FUNCTIONS = {"float", "int", "bool", "round", "len", "str"}

BATCHNORM_NAMES = re.compile(r"^(BatchNorm[123]d|SyncBatchNorm|LazyBatchNorm[123]d|batch_norm)$")
# torchvision constructors of models that contain BatchNorm layers.
BATCHNORM_MODELS = re.compile(
    r"^(resnet\d+|resnext\w+|wide_resnet\w+|densenet\d+|mobilenet_v[23]\w*|efficientnet\w*|regnet_\w+"
    r"|inception_v3|googlenet|shufflenet\w+|mnasnet\w+|vgg\d+_bn|fcn_resnet\w+|deeplabv3_\w+)$"
)
DTYPE_HALF = {"torch.float16", "torch.half"}
ITERATOR_WRAPPERS = {"enumerate", "iter", "zip", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "itertools.islice"}
# DataLoader(dataset, batch_size, ...): where each knob's argument sits, as its module declares (`Written.position`).
DATALOADER_POSITIONAL = {k.name: k.written.position for k in written_at(IN_LOADER) if k.written.position is not None}
OPTIMIZER_NAME = re.compile(r"optim|^opt|scaler", re.IGNORECASE)

"""What training minimises: the language-modelling loss, the boundary policy's estimators and
their variance reducers, rate control, and the lexicon prior."""

from rltok.objective.advantages import batch_relative, discounted_cumsum, gae, group_relative
from rltok.objective.controller import LagrangePrice
from rltok.objective.loss import compute_loss
from rltok.objective.policy_gradient import masked_mean, policy_gradient_loss, rate_loss

__all__ = ["batch_relative", "compute_loss", "discounted_cumsum", "gae", "group_relative", "LagrangePrice",
           "masked_mean", "policy_gradient_loss", "rate_loss"]

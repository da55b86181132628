from .advantages import batch_relative, discounted_cumsum, gae, group_relative
from .controller import LagrangePrice
from .losses import masked_mean, policy_gradient_loss, rate_loss

__all__ = ["batch_relative", "discounted_cumsum", "gae", "group_relative", "LagrangePrice", "masked_mean",
           "policy_gradient_loss", "rate_loss"]

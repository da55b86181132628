from .advantages import batch_relative, discounted_cumsum, gae, group_relative
from .losses import masked_mean, policy_gradient_loss, rate_loss

__all__ = ["batch_relative", "discounted_cumsum", "gae", "group_relative", "masked_mean",
           "policy_gradient_loss", "rate_loss"]

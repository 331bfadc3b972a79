# Sourced by the *_install.sh scripts (from the repository root): sets RC, the directory test
# servers are installed into: ${RATEBEAM_RC:-.rc}, or $HOME/.cache/ratebeam when that cannot be
# created or written (RATEBEAM_RC unset and the repository read-only).  The fixtures look in both.
RC="${RATEBEAM_RC:-$PWD/.rc}"
if ! mkdir -p "$RC" 2>/dev/null || [ ! -w "$RC" ]; then
  RC="$HOME/.cache/ratebeam"
  mkdir -p "$RC"
fi

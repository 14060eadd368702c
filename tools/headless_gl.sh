#!/usr/bin/env bash
# OpenGL without a display, for MuJoCo's video frames (`python -m pipeline.eval <run> video=true`, task.capture_video)
# on a server or in CI: EGL through Mesa. pipeline.rl.envs.headless_gl sets MUJOCO_GL=egl (else osmesa) when no
# DISPLAY is set. `make setup` and .ci/run call this; idempotent: with the libraries present it installs nothing.
#   bash tools/headless_gl.sh
# Needs root and Debian/Ubuntu's apt to install; elsewhere it prints what to install and exits 0 (only MuJoCo videos
# without a display need it). Exit 1: apt-get failed.
set -euo pipefail

PACKAGES=(libegl1 libegl-mesa0 libgl1-mesa-dri)
say() { echo "headless-gl: $*"; }

libs=$(ldconfig -p 2>/dev/null || true)
if grep -q 'libEGL\.so\.1 ' <<<"$libs" && grep -Eq 'libEGL_(mesa|nvidia)\.so' <<<"$libs"; then
  say "EGL is installed (MuJoCo renders off-screen with MUJOCO_GL=egl)"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  say "no EGL library; MuJoCo videos without a display need one: apt-get install ${PACKAGES[*]} (as root), or OSMesa"
  exit 0
fi
say "installing ${PACKAGES[*]} (Debian packages)"
apt-get update -qq >/dev/null || { say "apt-get update failed"; exit 1; }
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null \
  || { say "apt-get install ${PACKAGES[*]} failed"; exit 1; }
say "EGL installed"

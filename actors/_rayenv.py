"""The environment Ray must find before it is first imported (``ray_constants`` reads it at
import time), set by ``import actors`` itself so that no module of ours can import Ray first.
Nothing here imports Ray. Why each variable: the comment above it; docs/ray-notes.md.
"""

import os

# Ray 2.60 binds its servers to every interface, and resolves "127.0.0.1" in an attach
# address to the machine's address, unless this is 0 (then loopback stays loopback).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Record decoding allocates and frees large buffers per call; glibc's default trims and
# re-maps them each time (~35% of decode time, measured). Ray's worker processes inherit
# the environment of the process that starts Ray, so this reaches every actor.
os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", "1000000000")
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "1000000000")
# [cli] Ray 2.60 turns token auth on by itself when ~/.ray/auth_token exists, but a second
# driver attaching with ray.init(address=...) only sends the token when RAY_AUTH_MODE=token
# is in its environment (without it the attach hangs until its timeout: measured). Set the
# mode explicitly, on both the side that starts Ray and the side that attaches.
if os.path.exists(os.path.expanduser("~/.ray/auth_token")):
    os.environ.setdefault("RAY_AUTH_MODE", "token")

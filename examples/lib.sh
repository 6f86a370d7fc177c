# Shared helpers for the example recipes; source it, do not run it.

# throttle N: wait until fewer than N of this shell's background jobs run
throttle() {
  while [ "$(jobs -rp | wc -l)" -ge "$1" ]; do wait -n; done
}

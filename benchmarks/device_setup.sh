# Sourced by the device-run scripts (run from the repository root on the GPU machine): carried wheels
# in .whl/ (if any) go to /tmp/site, and strata_plan is installed editable, or reached through a path
# shim when pip cannot install it there.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip.log 2>&1; then
  echo "editable install failed ($(tail -1 /tmp/pip.log)); using a path shim"
  mkdir -p /tmp/shim/strata_plan && ln -sf "$PWD"/strata_plan/* /tmp/shim/strata_plan/
  for d in planner profiler engine kernels profiles; do ln -sfn "$PWD/$d" /tmp/shim/strata_plan/$d; done
  export PYTHONPATH=/tmp/shim${PYTHONPATH:+:$PYTHONPATH}
fi

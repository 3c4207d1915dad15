# Sourced by the device-run scripts (run from the repository root on the GPU machine): carried wheels
# in .whl/ (if any) go to /tmp/site, and strata_plan is installed editable, or imported from the checkout
# (PYTHONPATH) when pip cannot install it there.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip.log 2>&1; then
  echo "editable install failed ($(tail -1 /tmp/pip.log)); importing strata_plan from $PWD"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

# Custom SDK container for Dataflow workers, also usable as the Flex Template launcher image.
#
#   docker build --build-arg BEAM_VERSION="$(cat BEAM_VERSION)" -t REGION-docker.pkg.dev/PROJECT/REPO/mixtrain-convert:TAG .
#
# BEAM_VERSION has no default on purpose: the version lives only in the BEAM_VERSION file, and the
# image must carry the same Beam as the package (setup.py reads the same file). PYTHON_VERSION
# must be the launcher's Python minor version (pickled DoFns cross between them).
ARG PYTHON_VERSION=3.11
ARG BEAM_VERSION
FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}
ARG PYTHON_VERSION

# Flex Template launcher binary, so the same image launches the job and runs its workers.
COPY --from=gcr.io/dataflow-templates-base/python311-template-launcher-base:latest \
     /opt/google/dataflow/python_template_launcher /opt/google/dataflow/python_template_launcher

WORKDIR /template
COPY BEAM_VERSION MANIFEST.in README.md pyproject.toml setup.py ./
COPY formats ./formats
COPY transforms ./transforms
COPY pipelines ./pipelines
COPY mixtrain_convert ./mixtrain_convert
RUN pip install --no-cache-dir ".[lake,lance]" && python -c "import apache_beam, av, pyarrow, formats, pyiceberg, deltalake, lance; print(apache_beam.__version__)"

ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/template/pipelines/convert.py
ENV FLEX_TEMPLATE_PYTHON_SETUP_FILE=/template/setup.py
# Workers use this image as it is: nothing to install at start-up.
ENV PIP_NO_DEPS=True
# The Beam SDK image's boot program stays the entrypoint for workers; the Flex launcher calls
# /opt/google/dataflow/python_template_launcher itself.

# The UndoLog operator image: `undolog operator` as a non-root user, no build tools inside.
# Built by `make image` (tools/image.sh: buildah, no Docker engine, no network inside the build):
# dependencies are the locked wheels (requirements/operator.txt: exact versions, hashes checked),
# downloaded beforehand into build/wheels with the project's own wheel beside them.
# Any Debian-based image with python3 (3.11) and python3-venv serves as BASE; `make image` makes
# one with debootstrap when none is given. No `# syntax=` line: nothing here needs a frontend
# other than the builder's own, and fetching one would need a registry.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
RUN python3 -m venv /opt/undolog
COPY requirements/operator.txt /src/requirements.txt
COPY build/wheels/ /wheels/
RUN /opt/undolog/bin/pip install --no-cache-dir --no-index --find-links /wheels \
        --require-hashes -r /src/requirements.txt \
 && /opt/undolog/bin/pip install --no-cache-dir --no-index --no-deps /wheels/undolog-*.whl

FROM ${BASE}
RUN groupadd --gid 65532 undolog \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin undolog
COPY --from=build /opt/undolog /opt/undolog
ENV PATH=/opt/undolog/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["undolog", "operator"]

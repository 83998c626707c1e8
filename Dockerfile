# syntax=docker/dockerfile:1
# The UndoLog operator image: `undolog operator` as a non-root user, no build tools inside.
# Dependencies come from the lock (requirements/operator.txt: exact versions, hashes checked).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
RUN python3 -m venv /opt/undolog
COPY requirements/operator.txt requirements/operator.txt
RUN /opt/undolog/bin/pip install --no-cache-dir --require-hashes -r requirements/operator.txt
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/undolog/bin/pip install --no-cache-dir --no-deps .

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

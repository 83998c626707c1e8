# The UndoLog operator image: `undolog operator` as a non-root user, no build tools inside.
# syntax=docker/dockerfile:1

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
RUN python -m venv /opt/undolog
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/undolog/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/undolog/bin/pip install --no-cache-dir .

FROM python:3.11-slim-bookworm
RUN groupadd --gid 65532 undolog \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin undolog
COPY --from=build /opt/undolog /opt/undolog
ENV PATH=/opt/undolog/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["undolog", "operator"]

# The tunefleet image: the operator, and the bootstrap / publish / fetch steps it adds to
# tuning Jobs and model pods. The tuner itself runs in the user's image (copied by bootstrap).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY tuner_job ./tuner_job
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Non-root, matching builders/security.py TUNEFLEET_UID and the chart's securityContext.
USER 65532:65532
ENTRYPOINT []
CMD ["tunefleet-operator"]

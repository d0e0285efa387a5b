# rdmaplane's one image, for every component: the node agent, the standalone device plugin, the
# DRA driver, the scheduler extender, the admission webhook and the doctor (docs/image.md).
#
#   docker build -t ghcr.io/rdmaplane/rdmaplane:0.1.0 .
#
# `make image` builds the same image where no registry can be reached (an OCI archive): it runs
# the build stage's recipe on the build machine and packs the final stage below as written here,
# so this file is the one description of the image's layers and settings.

# The build stage only runs the recipe; nothing of it is in the image. Pinned by digest.
FROM debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# image/debian.lock's Debian packages (hashes checked), rdmaplane's wheel built from this
# checkout and constraints.txt's pinned wheels, installed in a root of their own: /layers/*/.
ARG SOURCE_DATE_EPOCH
RUN python3 -m image layers /layers

# The image: those three layers and nothing else (no package manager, no compiler).
FROM scratch
COPY --from=build /layers/debian/ /
COPY --from=build /layers/python/ /
COPY --from=build /layers/rdmaplane/ /
# Non-root by default: the webhook and the scheduler extender run as this user. The node agent,
# the device plugin, the DRA driver and the doctor set runAsUser: 0 (docs/security.md says why).
USER 65532:65532
ENV PATH=/opt/rdmaplane/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /
ENTRYPOINT ["rdmaplane"]
CMD ["--help"]
LABEL org.opencontainers.image.title=rdmaplane \
      org.opencontainers.image.description="RDMA networking for distributed AI on Kubernetes GPU clusters" \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.base.name=scratch

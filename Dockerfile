# syntax=docker/dockerfile:1
#
# The manager image: `ichor` built static (no cgo) and reproducible
# (-trimpath, no VCS stamp), on distroless static, run as the distroless
# nonroot user. It holds no shell and no package manager; the chart runs it
# with a read-only root filesystem and an emptyDir at /tmp, where the policy
# engine writes its bundle.
#
#   docker build -t ghcr.io/ichor-dev/ichor-policy:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... .
#
# The entrypoint is `/ichor manager`; the chart passes only the flags.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
# Dependencies first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ichor ./cmd/ichor

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/ichor /ichor
# 65532 is distroless's nonroot; numeric, so runAsNonRoot can verify it.
USER 65532:65532
ENTRYPOINT ["/ichor", "manager"]

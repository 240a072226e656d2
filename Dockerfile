# syntax=docker/dockerfile:1
# flashgate: a static binary on distroless, running as nonroot.
#   make image                                  (docker build, version and commit from git)
#   docker build --build-arg VERSION=v1.2.3 --build-arg COMMIT=$(git rev-parse HEAD) -t flashgate:dev .
#   docker run --rm flashgate:dev --help        (ENTRYPOINT is "flashgate serve")
# The binary is at /bin/ratelimit too: run by that name (Envoy Gateway's
# command: /bin/ratelimit) it is `flashgate ratelimit`, configured by
# envoyproxy/ratelimit's environment variables (docs/ratelimit.md).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first, so source edits reuse the download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS TARGETARCH
# What `flashgate version` prints. The build context has no .git, so Go cannot
# stamp the commit itself: `make image` passes both from git.
ARG VERSION COMMIT
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X main.stampedVersion=${VERSION} -X main.stampedCommit=${COMMIT}" -o /out/flashgate ./cmd/flashgate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/flashgate /usr/local/bin/flashgate
COPY --from=build /out/flashgate /bin/ratelimit
USER 65532:65532
# 9191: ext_authz gRPC (+ grpc.health.v1, reflection); 9192: /metrics /healthz /readyz.
# Both bind 127.0.0.1 by default: set FLASHGATE_GRPC_ADDR / FLASHGATE_HTTP_ADDR
# to reach them from outside the container (docker-compose.yml does).
# As ratelimit: 8081 gRPC, 8080 /healthcheck and /json, 6070 /metrics (0.0.0.0).
EXPOSE 9191 9192 8080 8081 6070
ENTRYPOINT ["/usr/local/bin/flashgate", "serve"]

# Images of prewarm's controller and agent: docker build --target controller|agent .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/ ./cmd/controller ./cmd/agent ./cmd/sleeper

FROM gcr.io/distroless/static-debian12:nonroot AS controller
COPY --from=build /out/controller /controller
ENTRYPOINT ["/controller"]

# The agent writes to root-owned host directories, so it runs as root; it mounts only the
# allowed roots.
FROM gcr.io/distroless/static-debian12 AS agent
COPY --from=build /out/agent /agent
# The image cache pods' init container installs /sleeper for the target image's container.
COPY --from=build /out/sleeper /sleeper
ENTRYPOINT ["/agent"]

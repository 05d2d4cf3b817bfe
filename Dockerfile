# contbench, the load generator and correctness check, and contproxy, the
# gateway, as containers.
# Build: docker build -t contbench .                       (the default target)
#        docker build --target contproxy -t contproxy .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/contbench ./cmd/contproxy

FROM debian:bookworm-slim AS contproxy
COPY --from=build /out/contproxy /usr/local/bin/contproxy
USER nobody
# Outside the container's loopback: the flags still win.
ENV CONTPROXY_LISTEN=:8080 CONTPROXY_OPS_LISTEN=:9090
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/contproxy"]

FROM debian:bookworm-slim AS contbench
COPY --from=build /out/contbench /usr/local/bin/contbench
USER nobody
ENTRYPOINT ["/usr/local/bin/contbench"]

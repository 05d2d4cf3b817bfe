# contbench, the load generator and correctness check, as a container.
# Build: docker build -t contbench .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/contbench ./cmd/contbench

FROM debian:bookworm-slim
COPY --from=build /out/contbench /usr/local/bin/contbench
USER nobody
ENTRYPOINT ["/usr/local/bin/contbench"]

package image_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/deploy/image"
)

func TestPlatformsAreReadOrRefusedByName(t *testing.T) {
	got, err := image.ParsePlatforms("linux/amd64, linux/arm64/v8")
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "arm64", got[1].Architecture)
	require.Equal(t, "v8", got[1].Variant)

	_, err = image.ParsePlatforms("linux/amd64,")
	require.Error(t, err, "an empty entry is not a platform")
}

func TestSourceDateEpochIsTheEnvironmentsOrTheEpoch(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	got, err := image.SourceDateEpoch()
	require.NoError(t, err)
	require.True(t, got.Equal(time.Unix(0, 0)))

	t.Setenv("SOURCE_DATE_EPOCH", "1764547200")
	got, err = image.SourceDateEpoch()
	require.NoError(t, err)
	require.Equal(t, time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC), got)

	t.Setenv("SOURCE_DATE_EPOCH", "yesterday")
	_, err = image.SourceDateEpoch()
	require.ErrorContains(t, err, "not a number of seconds")
}
